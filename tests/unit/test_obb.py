"""The oriented-box task: rotated geometry (ProbIoU, NMS, polygon IoU, corner fitting), rotated
mAP, the RT-DETRv2-OBB variant's predict (top-k, boxes back in image pixels), the OBB result
field (plot, json), task-variant selection and the rotated set loss."""
import json
import math

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.rtdetrv2.obb import RTDETRv2OBB, obb_postprocess
from libreyolo.tasks.obb import OBB
from libreyolo.tasks.obb.metrics import rotated_map
from libreyolo.tasks.obb.rotated import (
    corners_to_xywhr,
    polygon_iou,
    probiou,
    rotated_nms,
    xywhr_to_corners,
    xywhr_to_corners_np,
)
from libreyolo.tasks.obb.task import suppress, unletterbox_xywhr


@pytest.fixture(scope="module")
def obb_model():
    return LibreYOLO.new("rtdetrv2", "n", task="obb", device="cpu", seed=0)


def test_corners_and_boxes_round_trip():
    rows = np.array([[50.0, 40.0, 30.0, 10.0, 0.3], [10.0, 20.0, 8.0, 4.0, 2.9]])
    back = corners_to_xywhr(xywhr_to_corners_np(rows))
    assert np.allclose(back, rows, atol=1e-9)
    # a box given with its short side first comes back with the long side as width, angle + pi/2
    tall = corners_to_xywhr(xywhr_to_corners_np(np.array([[0.0, 0.0, 4.0, 8.0, 0.0]])))
    assert np.allclose(tall, [[0.0, 0.0, 8.0, 4.0, math.pi / 2]], atol=1e-9)
    pts = xywhr_to_corners(torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0]]))
    assert torch.allclose(pts[0], torch.tensor([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]]))


def test_probiou_is_one_for_the_same_box_and_periodic_in_pi():
    a = torch.tensor([[10.0, 10.0, 8.0, 3.0, 0.4]])
    assert probiou(a, a).item() == pytest.approx(1.0, abs=1e-3)
    turned = a.clone()
    turned[0, 4] += math.pi
    assert probiou(a, turned).item() == pytest.approx(1.0, abs=1e-3)
    far = a.clone()
    far[0, 0] += 100
    assert probiou(a, far).item() < 1e-3
    across = a.clone()
    across[0, 4] += math.pi / 2
    assert 0.05 < probiou(a, across).item() < 0.9
    assert torch.allclose(probiou(a, across), probiou(across, a))
    thin = torch.tensor([[10.0, 10.0, 0.0, 3.0, 0.4]], requires_grad=True)     # a degenerate box
    probiou(thin, a).sum().backward()
    assert torch.isfinite(thin.grad).all()


def test_polygon_iou_is_exact():
    sq = np.array([[0.0, 0.0, 2.0, 2.0, 0.0]])
    half = np.array([[1.0, 0.0, 2.0, 2.0, 0.0]])
    assert polygon_iou(sq, half)[0, 0] == pytest.approx(1 / 3)
    # a square turned by 90 degrees is itself; turned by 45 degrees, the overlap is an octagon
    assert polygon_iou(sq, np.array([[0.0, 0.0, 2.0, 2.0, math.pi / 2]]))[0, 0] == pytest.approx(1.0)
    octagon = 8 * (math.sqrt(2) - 1)                          # area of the overlap of two unit-half squares
    expect = octagon / (8 - octagon)
    assert polygon_iou(sq, np.array([[0.0, 0.0, 2.0, 2.0, math.pi / 4]]))[0, 0] == pytest.approx(expect)
    assert polygon_iou(sq, np.zeros((0, 5))).shape == (1, 0)


def test_rotated_nms_drops_same_class_overlaps_only():
    boxes = torch.tensor([[[10.0, 10.0, 8.0, 4.0, 0.3], [10.5, 10.0, 8.0, 4.0, 0.3], [10.0, 10.0, 8.0, 4.0, 0.3],
                           [40.0, 40.0, 8.0, 4.0, 1.0]]])
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6]])
    cls = torch.tensor([[0, 0, 1, 0]])
    assert rotated_nms(boxes, scores, cls, 0.5).tolist() == [[True, False, True, True]]
    assert rotated_nms(boxes, scores, cls, 0.5, agnostic=True).tolist() == [[True, False, False, True]]
    _, kept, _ = suppress((boxes, scores, cls), 0.5, False)
    assert kept.tolist() == [[pytest.approx(0.9), 0.0, pytest.approx(0.7), pytest.approx(0.6)]]


def test_rotated_map_scores_perfect_missing_and_shifted_predictions():
    gt = {"xywhr": np.array([[20.0, 20.0, 10.0, 4.0, 0.5], [50.0, 50.0, 12.0, 6.0, 2.0]]), "cls": np.array([0, 1])}
    perfect = {"xywhr": gt["xywhr"], "scores": np.array([0.9, 0.8]), "cls": gt["cls"]}
    assert rotated_map([perfect], [gt]) == {"map50": pytest.approx(1.0), "map50_95": pytest.approx(1.0)}
    none = {"xywhr": np.zeros((0, 5)), "scores": np.zeros(0), "cls": np.zeros(0)}
    assert rotated_map([none], [gt]) == {"map50": 0.0, "map50_95": 0.0}
    shifted = dict(perfect, xywhr=gt["xywhr"] + np.array([1.0, 0, 0, 0, 0]))
    m = rotated_map([shifted], [gt])
    assert m["map50"] == pytest.approx(1.0) and 0.0 < m["map50_95"] < 1.0
    wrong_class = dict(perfect, cls=np.array([1, 0]))
    assert rotated_map([wrong_class], [gt])["map50"] == 0.0
    assert math.isnan(rotated_map([none], [{"xywhr": np.zeros((0, 5)), "cls": np.zeros(0)}])["map50"])


def test_postprocess_top_k_in_canvas_pixels_with_radians():
    logits = torch.tensor([[[-3.0, 0.0], [2.0, -1.0]]])
    boxes = torch.tensor([[[0.1, 0.2, 0.3, 0.4, 0.25], [0.5, 0.5, 0.2, 0.1, 0.5]]])
    xywhr, scores, cls = obb_postprocess(logits, boxes, width=100, height=100, num_top=2)
    assert torch.allclose(scores, torch.sigmoid(torch.tensor([[2.0, 0.0]])))
    assert cls.tolist() == [[0, 1]]
    assert torch.allclose(xywhr[0, 0], torch.tensor([50.0, 50.0, 20.0, 10.0, math.pi / 2]))
    assert torch.allclose(xywhr[0, 1], torch.tensor([10.0, 20.0, 30.0, 40.0, math.pi / 4]))


def test_boxes_map_back_to_image_pixels():
    rows = np.array([[32.0, 16.0, 10.0, 4.0, 0.7]])
    back = unletterbox_xywhr(rows, 0.5, 0.5)
    assert np.allclose(back, [[64.0, 32.0, 20.0, 8.0, 0.7]])
    # unequal scales: the corners map back and the rectangle is refitted
    axis = unletterbox_xywhr(np.array([[10.0, 10.0, 4.0, 2.0, 0.0]]), 0.5, 0.4)
    assert np.allclose(axis, [[20.0, 25.0, 8.0, 5.0, 0.0]])


def test_predict_gives_rotated_boxes_in_original_pixels(obb_model, monkeypatch):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (96, 160, 3), dtype=np.uint8)
    seen = []
    infer = obb_model.infer
    monkeypatch.setattr(obb_model, "infer", lambda x: seen.append(infer(x)) or seen[-1])
    out = obb_model(image, conf=0.0, imgsz=320, max_det=50)
    r = out[0] if isinstance(out, list) else out
    assert r.boxes is None and len(r) == len(r.obb) == 50
    # the canvas (320 x 320, letterboxed to the top-left: scale 2) mapped back to the 160 x 96 image
    canvas = seen[-1][0][0, :50].double()
    assert torch.allclose(r.obb.xywhr[:, :4].double(), canvas[:, :4] / 2, atol=1e-3)
    assert torch.allclose(r.obb.xywhr[:, 4].double(), canvas[:, 4], atol=1e-5)
    assert torch.equal(r.obb.conf, seen[-1][1][0, :50])
    assert r.obb.xyxyxyxy.shape == (50, 4, 2) and r.obb.xyxy.shape == (50, 4)
    rows = json.loads(r.to_json())
    assert len(rows) == 50 and set(rows[0]) == {"name", "class", "confidence", "box", "corners"}
    assert set(rows[0]["box"]) == {"cx", "cy", "w", "h", "angle"} and len(rows[0]["corners"]) == 4
    assert r.plot().shape == (96, 160, 3)
    assert r.cpu().obb.data.shape == (50, 7) and r.numpy().obb.data.shape == (50, 7)


def test_obb_plot_draws_the_rotated_outline():
    data = torch.tensor([[50.0, 50.0, 60.0, 20.0, math.pi / 4, 0.9, 0.0]])
    blank = np.zeros((100, 100, 3), np.uint8)
    drawn = OBB(data, (100, 100)).plot_on(blank, {0: "thing"})
    corner = OBB(data, (100, 100)).xyxyxyxy[0, 1].round().int().tolist()     # the width side's end
    assert drawn[corner[1], corner[0]].any() and not drawn[50, 50].any() and not drawn[95, 5].any()
    with pytest.raises(ValueError, match=r"\(n, 7\)"):
        OBB(torch.zeros(2, 5), (10, 10))


def test_task_variant_is_chosen_by_task_name_and_checkpoint(tmp_path, obb_model):
    assert isinstance(obb_model, RTDETRv2OBB) and obb_model.TASK == "obb" and obb_model.nc == 15
    assert obb_model.names[0] == "plane" and obb_model.imgsz == 1024
    assert type(LibreYOLO.new("rtdetrv2", "r18", device="cpu")).__name__ == "RTDETRv2"
    assert isinstance(LibreYOLO("rtdetrv2-n-obb", device="cpu", nc=2), RTDETRv2OBB)
    with pytest.raises(ValueError, match="sizes: n, s, m, l, x"):
        LibreYOLO("rtdetrv2-r18-obb", device="cpu")
    path = obb_model.save(tmp_path / "obb.pt")
    loaded = LibreYOLO(str(path), device="cpu")
    assert isinstance(loaded, RTDETRv2OBB) and loaded.TASK == "obb" and loaded.meta["task"] == "obb"
    x = torch.rand(1, 3, 320, 320)
    with torch.no_grad():
        a, b = obb_model.model(x), loaded.model(x)
    assert torch.equal(a["pred_boxes"], b["pred_boxes"])


def _obb_batch(bucket):
    from libreyolo.tasks.obb.data import collate_obb
    items = []
    for n in (1, 3):
        boxes = torch.tensor([[0.3 + 0.2 * i, 0.5, 0.3, 0.1, 0.4 * i] for i in range(n)])
        items.append((torch.zeros(3, 64, 64, dtype=torch.uint8), torch.arange(n) % 2, boxes))
    return collate_obb(items, bucket=bucket)


def test_rotated_set_loss_ignores_padding_and_trains_every_output():
    model = LibreYOLO.new("rtdetrv2", "n", task="obb", device="cpu", seed=0, nc=2)
    net, loss_fn = model.model, model.build_loss()
    assert loss_fn.item_names == ("cls_loss", "l1_loss", "angle_loss", "probiou_loss")
    torch.manual_seed(0)
    x = torch.rand(2, 3, 320, 320)
    net.train()
    try:
        out = model.train_forward(net, x)
        small, large = _obb_batch(4), _obb_batch(16)
        assert small[1].shape[1] == 4 and large[1].shape[1] == 16
        loss_a, items_a = loss_fn(out, *small[1:])
        loss_b, items_b = loss_fn(out, *large[1:])
        assert torch.equal(items_a, items_b) and torch.isfinite(loss_a) and (items_a > 0).all()
        assert len(out["aux_outputs"]) == 2 and out["enc_outputs"]["pred_boxes"].shape[-1] == 5
        loss_a.backward()
        for name in ("decoder.dec_score_head.2.weight", "decoder.dec_bbox_head.2.layers.2.weight",
                     "decoder.enc_bbox_head.layers.2.weight", "backbone.stem.stem1.conv.weight"):
            g = net.get_parameter(name).grad
            assert g is not None and g.abs().sum() > 0, name
    finally:
        net.zero_grad(set_to_none=True)
        net.eval()


def test_a_dense_family_gets_rotated_nms_in_the_stage(monkeypatch):
    """A family with NMS (the contract a YOLO-style OBB head follows): overlapping candidates of one
    class are suppressed by the task's rotated NMS, fixed-shape, before the host keeps conf."""
    model = LibreYOLO.new("rtdetrv2", "n", task="obb", device="cpu", seed=0, nc=2)
    monkeypatch.setattr(model, "NMS", True)
    boxes = torch.tensor([[[100.0, 100.0, 80.0, 30.0, 0.5], [102.0, 100.0, 80.0, 30.0, 0.5],
                           [100.0, 100.0, 80.0, 30.0, 0.5], [200.0, 200.0, 40.0, 20.0, 1.0]]])
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6]])
    cls = torch.tensor([[0, 0, 1, 0]])
    monkeypatch.setattr(model, "infer", lambda x: (boxes.expand(len(x), -1, -1), scores.expand(len(x), -1),
                                                   cls.expand(len(x), -1)))
    out = model(np.zeros((320, 320, 3), np.uint8), conf=0.5, imgsz=320)
    r = out[0] if isinstance(out, list) else out
    assert r.obb.conf.tolist() == pytest.approx([0.9, 0.7, 0.6]) and r.obb.cls.tolist() == [0, 1, 0]
    out = model(np.zeros((320, 320, 3), np.uint8), conf=0.5, imgsz=320, agnostic_nms=True)
    r = out[0] if isinstance(out, list) else out
    assert r.obb.conf.tolist() == pytest.approx([0.9, 0.6])


def test_the_letterbox_pads_black_as_the_reference_and_the_metadata_says_so(obb_model):
    from libreyolo.ops.preprocess import Preprocess
    x = obb_model.preprocess(torch.full((1, 50, 100, 3), 255, dtype=torch.uint8), 64)
    assert x.shape == (1, 3, 64, 64) and (x[..., :32, :] == 1).all() and (x[..., 32:, :] == 0).all()
    assert obb_model.preprocess.as_dict()["pad"] == 0.0
    assert "pad" not in Preprocess("topleft").as_dict()           # other families' metadata as before
    assert Preprocess.from_meta({"resize": "topleft"}, obb_model.PREPROCESS).pad == 0.0
    with pytest.raises(ValueError, match="pad"):
        Preprocess("topleft", pad=300)


def test_fusing_folds_the_identity_branch():
    from libreyolo.models.rtdetrv2.obb_nn import IdentityRepVggBlock
    torch.manual_seed(0)
    block = IdentityRepVggBlock(8, 8)
    for m in block.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-1, 1)
    block.eval()
    x = torch.randn(2, 8, 9, 9)
    with torch.no_grad():
        before = block(x)
        block.reparameterize()
        after = block(x)
    assert block.identity is None and block.fused is not None
    assert torch.allclose(before, after, atol=1e-5)


def test_rotated_map_of_upright_boxes_equals_coco_bbox_map():
    """For angle-0 boxes the polygon IoU is the box IoU, so the AP written out here must be
    faster-coco-eval's bbox AP (area range all, 100 detections per image)."""
    import contextlib
    import io

    from faster_coco_eval import COCO, COCOeval_faster
    rng = np.random.default_rng(0)
    preds, gts, images, anns, dets = [], [], [], [], []
    for i in range(6):
        n = int(rng.integers(1, 6))
        g = np.concatenate([rng.uniform(20, 80, (n, 2)), rng.uniform(5, 30, (n, 2)), np.zeros((n, 1))], 1)
        gc = rng.integers(0, 2, n)
        keep = rng.random(n) < 0.8
        p = g[keep] + np.concatenate([rng.normal(0, 2, (int(keep.sum()), 4)), np.zeros((int(keep.sum()), 1))], 1)
        p = np.concatenate([p, np.concatenate([rng.uniform(20, 80, (2, 2)), rng.uniform(5, 30, (2, 2)),
                                               np.zeros((2, 1))], 1)])          # two false positives
        pc = np.concatenate([gc[keep], rng.integers(0, 2, 2)])
        ps = rng.uniform(0.05, 1.0, len(p))
        preds.append({"xywhr": p, "scores": ps, "cls": pc})
        gts.append({"xywhr": g, "cls": gc})
        images.append({"id": i + 1, "width": 100, "height": 100})
        for b, c in zip(g, gc):
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(c) + 1, "iscrowd": 0,
                         "bbox": [b[0] - b[2] / 2, b[1] - b[3] / 2, b[2], b[3]], "area": float(b[2] * b[3])})
        for b, c, s in zip(p, pc, ps):
            dets.append({"image_id": i + 1, "category_id": int(c) + 1, "score": float(s),
                         "bbox": [b[0] - b[2] / 2, b[1] - b[3] / 2, b[2], b[3]]})
    ours = rotated_map(preds, gts, max_det=100)
    gt = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(gt)
        ev = COCOeval_faster(coco, coco.loadRes(dets), iouType="bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    assert 0.1 < ours["map50_95"] < 0.9 and ours["map50_95"] == pytest.approx(ev.stats[0], abs=1e-6)
    assert ours["map50"] == pytest.approx(ev.stats[1], abs=1e-6)


@pytest.mark.slow   # ~40 s on two CPU cores: the trace of the whole network
def test_the_predict_stage_traces_as_one_graph_equal_to_eager():
    """The network, its top-k and the rotated NMS of a dense family's candidates in one fullgraph
    trace (nothing read on the host: what a CUDA graph needs), bit for bit the eager stage, and
    reused by a second call."""
    from torch._dynamo.utils import counters
    model = LibreYOLO.new("rtdetrv2", "n", task="obb", nc=3, device="cpu", seed=0)
    model.model.eval()
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))

    def stage(x):
        xywhr, scores, cls = model.infer(x)
        return suppress((xywhr[:, :16], scores[:, :16], cls[:, :16]), 0.45, False)

    torch._dynamo.reset()
    counters.clear()
    try:
        with torch.no_grad():
            fn = torch.compile(stage, backend="aot_eager", fullgraph=True)
            traced, again = fn(x), fn(x)
            graphs = counters["stats"]["unique_graphs"]
            eager = stage(x)
    finally:
        torch._dynamo.reset()
    assert graphs == 1
    assert all(torch.equal(a, b) for a, b in zip(eager, traced))
    assert all(torch.equal(a, b) for a, b in zip(again, traced))
