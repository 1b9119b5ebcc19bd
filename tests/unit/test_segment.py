"""Instance segmentation (task ``segment``, RTMDet-Ins): mask head, predict, Results.masks."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from libreyolo import LibreYOLO
from libreyolo.models.rtmdet.model import Rtmdet, RtmdetSeg
from libreyolo.models.rtmdet.nn import DYNAMIC_CONVS, NUM_DYNAMIC_PARAMS, dynamic_masks
from libreyolo.results import Results
from libreyolo.tasks.segment import InstanceMasks
from libreyolo.tasks.segment.task import crop_to_boxes, sample_masks


def grouped_conv_masks(protos, params, points, strides, proto_stride):
    """The original's formulation: relative coordinates then prototypes, dynamic grouped 1x1
    convolutions (one group per instance)."""
    h, w = protos.shape[-2:]
    n = params.shape[0]
    ys, xs = torch.meshgrid(torch.arange(h) * proto_stride, torch.arange(w) * proto_stride, indexing="ij")
    coord = torch.stack((xs.reshape(-1), ys.reshape(-1)), -1).reshape(1, -1, 2).to(protos.dtype)
    rel = (points.reshape(-1, 1, 2) - coord).permute(0, 2, 1) / (strides.reshape(-1, 1, 1) * 8)
    x = torch.cat((rel.reshape(n, 2, h, w), protos[None].repeat(n, 1, 1, 1)), 1).reshape(1, -1, h, w)
    wn = [ci * co for ci, co in DYNAMIC_CONVS]
    bn = [co for _, co in DYNAMIC_CONVS]
    splits = torch.split_with_sizes(params, wn + bn, dim=1)
    for i, (ci, co) in enumerate(DYNAMIC_CONVS):
        wgt = splits[i].reshape(n * co, ci, 1, 1)
        x = F.conv2d(x, wgt, bias=splits[len(wn) + i].reshape(n * co), groups=n)
        if i < len(DYNAMIC_CONVS) - 1:
            x = F.relu(x)
    return x.reshape(n, h, w)


def test_dynamic_masks_equal_grouped_convolutions():
    g = torch.Generator().manual_seed(0)
    protos = torch.randn(8, 6, 7, generator=g, dtype=torch.float64)
    params = torch.randn(5, NUM_DYNAMIC_PARAMS, generator=g, dtype=torch.float64)
    points = torch.rand(5, 2, generator=g, dtype=torch.float64) * 50
    strides = torch.tensor([8.0, 16.0, 32.0, 8.0, 16.0], dtype=torch.float64)
    ref = grouped_conv_masks(protos, params, points, strides, 8)
    assert torch.allclose(dynamic_masks(protos, params, points, strides, 8), ref, atol=1e-10)
    # batched leading dimensions give each image's own
    both = dynamic_masks(torch.stack((protos, protos.flip(-1))), torch.stack((params, params)),
                         torch.stack((points, points)), torch.stack((strides, strides)), 8)
    assert torch.allclose(both[0], ref, atol=1e-10)
    assert not torch.allclose(both[1], ref)


def test_sample_masks_equal_upsampling_for_an_image_the_canvas_size():
    logits = torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ours = sample_masks(logits, 40, 40, 40, 1.0, 1.0, 0, 0)
    ref = F.interpolate(logits[None], scale_factor=8, mode="bilinear", align_corners=False)[0]
    assert torch.allclose(ours, ref, atol=1e-10)
    # a letterboxed image (top-left, half the canvas high): its rows read the upper half
    half = sample_masks(logits, 40, 20, 40, 1.0, 1.0, 0, 0)
    assert torch.allclose(half, ref[:, :20], atol=1e-10)


def test_crop_to_boxes_keeps_pixel_centres_inside():
    m = torch.ones(1, 4, 6, dtype=torch.bool)
    out = crop_to_boxes(m, torch.tensor([[1.0, 1.0, 3.0, 2.0]]))
    assert out[0].nonzero().tolist() == [[1, 1], [1, 2]]


def test_family_serves_detect_and_segment():
    assert Rtmdet.for_task("segment") is RtmdetSeg and RtmdetSeg.for_task("detect") is Rtmdet
    with pytest.raises(ValueError, match="no 'pose' model; its tasks: detect, segment"):
        LibreYOLO.new("rtmdet", "t", task="pose")
    m = LibreYOLO.new("rtmdet", "t", task="segment", nc=3, device="cpu", seed=0)
    assert (type(m), m.TASK, m.task.name, m.nc) == (RtmdetSeg, "segment", "segment", 3)
    assert type(LibreYOLO.new("rtmdet", "t", device="cpu")) is Rtmdet
    assert m.checkpoint()["task"] == "segment"


def test_saved_segment_model_loads_back_as_segment(tmp_path):
    m = LibreYOLO.new("rtmdet", "t", task="segment", nc=2, device="cpu", seed=0)
    back = LibreYOLO(str(m.save(tmp_path / "seg.pt")), device="cpu")
    assert type(back) is RtmdetSeg and back.nc == 2


@pytest.fixture(scope="module")
def seg_model():
    return LibreYOLO.new("rtmdet", "t", task="segment", nc=3, device="cpu", seed=0)


def test_predict_gives_masks_at_the_original_size(seg_model):
    img = (np.random.default_rng(0).random((90, 120, 3)) * 255).astype(np.uint8)
    out = seg_model(img, imgsz=64, conf=0.0, max_det=4)
    r = out[0] if isinstance(out, list) else out
    assert len(r.boxes) == 4 and isinstance(r.masks, InstanceMasks)
    assert r.masks.shape == (4, 90, 120) and r.masks.data.dtype == torch.bool
    assert r.masks.cls.tolist() == r.boxes.cls.to(torch.int64).tolist()
    # every mask pixel lies in its box (pixel centres)
    for m, (x1, y1, x2, y2) in zip(r.masks.data, r.boxes.xyxy.tolist()):
        ys, xs = m.nonzero(as_tuple=True)
        assert ((xs + 0.5 >= x1) & (xs + 0.5 <= x2) & (ys + 0.5 >= y1) & (ys + 0.5 <= y2)).all()
    rows = json.loads(r.to_json())
    assert len(rows) == 4 and {"box", "area", "polygons"} <= set(rows[0])
    assert [row["area"] for row in rows] == r.masks.areas.tolist()
    assert r.plot().shape == (90, 120, 3)


def test_instance_masks_fields_and_plot():
    data = np.zeros((2, 10, 12), bool)
    data[0, 2:6, 3:9] = True
    data[1, 7:9, 0:2] = True
    masks = InstanceMasks(data, np.array([0, 1]))
    assert masks.areas.tolist() == [24, 4]
    poly = masks.xy[0][0]
    assert poly[:, 0].min() == 3 and poly[:, 0].max() == 8 and poly[:, 1].min() == 2 and poly[:, 1].max() == 5
    assert np.allclose(masks.xyn[0][0], poly / [12, 10])
    t = masks.to("cpu")
    assert isinstance(t.data, torch.Tensor) and t.data.dtype == torch.bool and len(t[1]) == 1
    img = np.zeros((10, 12, 3), np.uint8)
    drawn = Results(img, "x", {0: "a", 1: "b"}, masks=masks).plot()
    assert drawn[3, 4].any() and not drawn[0, 11].any()
    with pytest.raises(ValueError, match="bool bitmaps"):
        InstanceMasks(np.zeros((1, 2, 2), np.uint8))
    with pytest.raises(ValueError, match="one class per mask"):
        InstanceMasks(data, np.array([0]))
