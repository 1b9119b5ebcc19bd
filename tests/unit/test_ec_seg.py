"""EC instance segmentation (task ``segment``: ECSeg, ``ec-s-seg``): variant resolution, predict
(masks mapped from the fixed 160 x 160 grid to the image), CLI, round trip, val, refused training.

The fixture reproduction is a row of ``rows.FIXTURES`` (tests/unit/test_fixtures.py).
"""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from test_fixtures import assert_reproduces, load_fixture, run_fixture
from torchvision.ops import box_convert

from libreyolo import LibreYOLO, cli
from libreyolo.models.ec.model import EC
from libreyolo.models.ec.pose import ECPose
from libreyolo.models.ec.seg import ECSeg
from libreyolo.models.registry import parse_spec
from libreyolo.results import Results
from libreyolo.tasks.segment import InstanceMasks


@pytest.fixture(scope="module")
def seg_model():
    return LibreYOLO.new("ec", "s", task="segment", nc=3, device="cpu", seed=0)


def test_ec_serves_detect_pose_and_segment():
    assert EC.for_task("segment") is ECSeg and ECSeg.for_task("detect") is EC
    assert ECSeg.for_task("pose") is ECPose and ECPose.for_task("segment") is ECSeg
    assert parse_spec("ec-s-seg") == (ECSeg, "s")
    assert cli._task_of("ec-s-seg").name == "segment"
    with pytest.raises(ValueError, match="sizes: s"):
        LibreYOLO.new("ec", "m", task="segment", device="cpu")


def test_mask_parts_equal_the_networks_masks_on_the_fixed_grid(seg_model):
    """Predict's (embedding, feature) factors of each picked (query, class) give the network's mask
    logits, on the 160 x 160 grid whatever the input size."""
    x = torch.rand(1, 3, 160, 160, generator=torch.Generator().manual_seed(0))
    net = seg_model.model.eval()
    with torch.no_grad():
        out = net(x)
        boxes, scores, cls, embed, feature = seg_model.infer(x)
    assert out["pred_masks"].shape == (1, 300, 160, 160)
    assert embed.shape == (1, 300, 192) and feature.shape == (1, 192, 160, 160)
    query = out["pred_logits"].sigmoid().flatten(1).topk(300, dim=1).indices // 3
    logits = seg_model.mask_logits(feature[0], embed[0])
    torch.testing.assert_close(logits, out["pred_masks"][0][query[0]], rtol=1e-5, atol=1e-4)


def test_predict_maps_the_grid_masks_to_the_image_and_boxes(seg_model):
    """Each kept instance's mask is the network's grid logits resized to the image (the stretch
    inverted), above 0, cut to its box; the result plots and serialises."""
    rgb = (np.random.default_rng(0).random((90, 120, 3)) * 255).astype(np.uint8)
    x = seg_model.preprocess(torch.from_numpy(rgb)[None], 128)
    bias = seg_model.model.mask_head.bias
    saved = bias.detach().clone()
    try:
        with torch.no_grad():   # the untrained logits centred on 0 in the best pair's box: masks neither empty nor full
            first = seg_model.model.eval()(x)
            q = int(first["pred_logits"][0].sigmoid().flatten().argmax()) // 3
            x1, y1, x2, y2 = (box_convert(first["pred_boxes"][0, q], "cxcywh", "xyxy") * 160).round().int().tolist()
            bias.sub_(first["pred_masks"][0, q, y1:y2, x1:x2].median())
            out = seg_model.model(x)
        r = seg_model(Image.fromarray(rgb), imgsz=128, conf=0.0, max_det=5)
    finally:
        with torch.no_grad():
            bias.copy_(saved)
    assert isinstance(r, Results) and isinstance(r.masks, InstanceMasks) and len(r.boxes) == 5
    assert r.masks.shape == (5, 90, 120) and r.masks.data.dtype == torch.bool
    assert r.masks.cls.tolist() == r.boxes.cls.to(torch.int64).tolist()
    scores, index = out["pred_logits"].sigmoid().flatten(1).topk(5, dim=1)
    torch.testing.assert_close(r.boxes.conf, scores[0], rtol=1e-5, atol=1e-6)
    full = F.interpolate(out["pred_masks"][0][index[0] // 3][:, None], size=(90, 120), mode="bilinear",
                         align_corners=False)[:, 0] > 0
    xs, ys = torch.arange(120) + 0.5, torch.arange(90) + 0.5
    b = r.boxes.xyxy
    inside = ((ys[None, :, None] >= b[:, 1, None, None]) & (ys[None, :, None] <= b[:, 3, None, None])
              & (xs[None, None, :] >= b[:, 0, None, None]) & (xs[None, None, :] <= b[:, 2, None, None]))
    expected = full & inside
    assert expected.any() and (inside & ~full).any()
    assert (expected != r.masks.data).sum() <= 0.01 * inside.sum()     # pixels whose logit is ~0 may flip
    rows = json.loads(r.to_json())
    assert len(rows) == 5 and {"box", "area", "polygons"} <= set(rows[0])
    assert r.plot().shape == (90, 120, 3)


def test_saved_segment_model_loads_back_as_segment(tmp_path, seg_model):
    back = LibreYOLO(str(seg_model.save(tmp_path / "seg.pt")), device="cpu")
    assert type(back) is ECSeg and back.nc == 3 and back.task == "segment"
    a, b = seg_model.model.state_dict(), back.model.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    torch.save({"model": a}, tmp_path / "anonymous.pt")        # no metadata: the mask head's keys decide
    assert type(LibreYOLO(str(tmp_path / "anonymous.pt"), device="cpu")) is ECSeg


def test_cli_predicts_masks_with_a_segment_checkpoint(tmp_path, seg_model, capsys):
    path = seg_model.save(tmp_path / "seg.pt")
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(tmp_path / "a.jpg")
    out = tmp_path / "det.json"
    assert cli.main(["predict", f"model={path}", f"source={tmp_path / 'a.jpg'}", "imgsz=64", "conf=0", "max_det=2",
                     "device=cpu", "save=false", f"json={out}"]) == 0
    rows = json.loads(out.read_text())[0]["detections"]
    assert len(rows) == 2 and {"area", "polygons"} <= set(rows[0])


def test_val_on_shapes_inst_gives_box_and_mask_map(tmp_path, seg_model):
    from libreyolo.tasks.segment.data import SHAPES_INST_NAMES, make_shapes_inst_dataset
    yaml = make_shapes_inst_dataset(tmp_path / "si", n_train=1, n_val=4, imgsz=64)
    m = LibreYOLO.new("ec", "s", task="segment", nc=len(SHAPES_INST_NAMES), device="cpu", seed=0)
    res = m.val(data=str(yaml), imgsz=64, batch=4, workers=0)
    assert {"map50", "map50_95", "mask_map50", "mask_map50_95"} <= set(res)
    assert all(0.0 <= res[k] <= 1.0 for k in ("map50", "map50_95", "mask_map50", "mask_map50_95"))


def test_training_is_refused_naming_the_mask_loss(seg_model):
    with pytest.raises(NotImplementedError, match="mask loss"):
        seg_model.train(data="shapes-inst")


def test_fixture_masks_compare_order_free_on_their_sample():
    """The fixture stores pred_masks as a sample of flat indices; with our queries in another order
    the order-free rule still pairs each sampled value with its matched query's mask, and a wrong
    mask in one query fails it."""
    fx, pt, sd = load_fixture("ec-s-seg")
    assert "pred_masks" in pt["outputs_sampled"] and "pred_masks" not in pt["outputs"]
    net = ECSeg.build_network("s", 80)
    net.load_state_dict(sd, strict=True)
    out = run_fixture(net.eval(), pt)
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(0))
    shuffled = {k: v[:, perm] for k, v in out.items()}
    assert_reproduces(shuffled, pt["outputs"], fx, pt["outputs_sampled"])
    shuffled["pred_masks"] = shuffled["pred_masks"].clone()
    hit = int((perm == pt["outputs_sampled"]["pred_masks"]["idx"][0].item() // (160 * 160)).nonzero())
    shuffled["pred_masks"][0, hit] += 100.0
    with pytest.raises(AssertionError, match="order-free, sampled"):
        assert_reproduces(shuffled, pt["outputs"], fx, pt["outputs_sampled"])
