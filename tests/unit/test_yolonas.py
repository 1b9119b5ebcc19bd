"""YOLO-NAS (detection) and YOLO-NAS-Pose: names, re-parameterization, the PP-YOLOE loss and the
pose loss (padding, graph-safety, learning), predict with NMS and per-keypoint visibility, ONNX export,
and two trainer epochs on the built-in shapes set raising mAP50 above the untrained model's."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from loss_cases import (
    ROWS,
    assert_no_host_sync,
    assert_padding_invariant,
    loss_without_objects,
    padded_targets,
)

from libreyolo import LibreYOLO
from libreyolo.models.registry import get_family, parse_spec
from libreyolo.models.yolonas import loss as loss_module
from libreyolo.models.yolonas import nn as ynn
from libreyolo.models.yolonas import pose_loss as pose_loss_module
from libreyolo.models.yolonas import pose_nn
from libreyolo.models.yolonas.loss import (
    TaskAlignedAssigner,
    YoloNASLoss,
    varifocal_loss,
)
from libreyolo.models.yolonas.model import YoloNAS
from libreyolo.models.yolonas.obb import YoloNASOBB, canonical_rboxes
from libreyolo.models.yolonas.pose import YoloNASPose
from libreyolo.models.yolonas.pose_loss import YoloNASPoseLoss, ciou_loss
from libreyolo.models.yolonas.pose_nn import YoloNASPoseNet
from libreyolo.ops.iou import bbox_ciou

#: a small width/depth for the loss tests (every block type present, 0.2 M parameters)
TINY = ynn.YoloNASConfig(8, (16, 16, 32, 32), (1, 1, 1, 1), (8, 8, 16, 16), (True, False, False, False),
                         (16, 16, 16, 32), (1, 1), (8, 8), (1, 1), (8, 8), 0.125)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(ynn.CONFIGS, "tiny", TINY)
    monkeypatch.setitem(pose_nn.POSE_HEAD_WIDTH, "tiny", 0.125)
    return "tiny"


# -- names and variants ---------------------------------------------------------------------------
def test_names_pick_the_family_and_its_pose_variant():
    assert parse_spec("yolonas-s") == (YoloNAS, "s") and parse_spec("LibreYOLONASl.pt") == (YoloNAS, "l")
    assert parse_spec("yolonas-n-pose") == (YoloNASPose, "n") and parse_spec("yolonas-m-pose") == (YoloNASPose, "m")
    assert parse_spec("yolonas-n") is None              # n is a pose size only (no detection release)
    assert parse_spec("ec-s-pose")[1] == "s"             # another family's variant still parses
    assert get_family("yolonas").for_task("pose") is YoloNASPose
    assert get_family("yolonas").for_task("obb") is YoloNASOBB
    with pytest.raises(ValueError, match="serves the tasks detect, pose, obb"):
        get_family("yolonas").for_task("segment")


def test_sizes_match_the_original_parameter_counts():
    """YOLO-NAS S/M/L 19.0/51.1/66.9 M and YOLO-NAS-Pose N/S/M/L 9.9/22.2/58.2/79.4 M (the training form,
    with the re-parameterized convs the checkpoints carry)."""
    with torch.device("meta"):
        det = {s: sum(p.numel() for p in ynn.YoloNASNet(s).parameters()) for s in ("s", "m", "l")}
        pose = {s: sum(p.numel() for p in YoloNASPoseNet(s).parameters()) for s in ("n", "s", "m", "l")}
    assert det == {"s": 19_053_888, "m": 51_182_658, "l": 66_976_392}
    assert pose == {"n": 9_901_483, "s": 22_226_028, "m": 58_208_046, "l": 79_366_452}


@pytest.mark.parametrize("pose", [False, True])
def test_fuse_keeps_the_outputs(tiny, pose):
    torch.manual_seed(0)
    net = (YoloNASPoseNet(tiny, 1, 5) if pose else ynn.YoloNASNet(tiny, 3))
    for m in net.modules():                        # non-trivial BatchNorm statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    net.eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        ref = net(x)[0]
        net.fuse()
        out = net(x)[0]
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# -- detection loss -------------------------------------------------------------------------------
def test_vfl_hand_values():
    x = torch.zeros(3)                                   # sigmoid 0.5, BCE = ln 2 for any target
    score = torch.tensor([0.8, 0.0, 0.0])
    label = torch.tensor([1.0, 1.0, 0.0])
    want = torch.tensor([math.log(2) * 0.8,              # positive: weighted by its target score
                         0.0,                            # the gt class at target 0 (weight 0)
                         math.log(2) * 0.75 * 0.25])     # negative: alpha * p^2
    torch.testing.assert_close(varifocal_loss(x, score, label), want)


def test_assigner_takes_the_top_k_anchors_inside_the_box():
    ys, xs = torch.meshgrid(torch.arange(8) * 8 + 4.0, torch.arange(8) * 8 + 4.0, indexing="ij")
    points = torch.stack((xs.flatten(), ys.flatten()), 1)
    gt = torch.tensor([[[0.0, 0.0, 32.0, 32.0], [40.0, 40.0, 64.0, 64.0]]])
    scores = torch.full((1, 64, 2), 0.5)
    pred = torch.cat((points - 6, points + 6), -1)[None]   # 12 px boxes at every anchor
    labels, _, soft, fg, gt_idx = TaskAlignedAssigner(topk=13)(
        scores, pred, points, torch.tensor([[0.0, 1.0]]), gt, torch.tensor([[True, True]]))
    inside0 = (points < 32).all(1)
    inside1 = (points > 40).all(1)
    assert fg[0].sum() == 13 + int(inside1.sum())       # 16 anchors in the first box, 9 in the second
    assert fg[0][inside1].all() and not (fg[0] & ~(inside0 | inside1)).any()
    assert (labels[0][inside1] == 1).all() and (gt_idx[0][inside1] == 1).all()
    # soft targets: each gt's best anchor gets its best IoU
    assert soft[0, :, 1].max().item() == pytest.approx(float(144 / 576), rel=1e-5)


def _tiny_outputs(tiny, nc=3, seed=0):
    torch.manual_seed(seed)
    net = ynn.YoloNASNet(tiny, nc).train()
    return net, net(torch.rand(3, 3, 64, 64))


def test_loss_ignores_padding_and_needs_no_objects(tiny):
    _, out = _tiny_outputs(tiny)
    crit = YoloNASLoss(3)
    items = assert_padding_invariant(lambda t, m: crit(out, t, m))
    assert (items > 0).all()
    loss, items = loss_without_objects(lambda t, m: crit(out, t, m), 3)
    assert loss.item() > 0 and items[1] == 0 and items[2] == 0
    assert_no_host_sync(loss_module.YoloNASLoss, loss_module.TaskAlignedAssigner, loss_module.varifocal_loss,
                        loss_module.distribution_focal_loss)


def test_loss_fits_one_batch(tiny):
    """A small network fits three images' boxes: each gt's best-scoring prediction lands on it."""
    net, _ = _tiny_outputs(tiny)
    crit = YoloNASLoss(3)
    x = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    t, m = padded_targets(ROWS, 4, garbage=False)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    first = None
    for _ in range(150):
        loss, _ = crit(net(x), t, m)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first
    with torch.no_grad():   # training-mode BatchNorm: the statistics the fit saw
        (boxes, scores), _ = net(x)
    from torchvision.ops import box_iou
    for b, rows in enumerate(ROWS):
        for c, *box in rows:
            best = scores[b, :, int(c)].argmax()
            assert box_iou(boxes[b, best][None], torch.tensor([box]))[0, 0] > 0.5


# -- pose loss ------------------------------------------------------------------------------------
def test_ciou_matches_the_yolo_ciou_for_ordinary_boxes():
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(50, 2, generator=gen) * 50
    a = torch.cat((xy, xy + torch.rand(50, 2, generator=gen) * 30 + 1), 1)
    xy = torch.rand(50, 2, generator=gen) * 50
    b = torch.cat((xy, xy + torch.rand(50, 2, generator=gen) * 30 + 1), 1)
    torch.testing.assert_close(ciou_loss(a, b), 1 - bbox_ciou(a, b, eps=1e-10), rtol=1e-5, atol=1e-6)


def _pose_targets(m: int, k: int = 5):
    """Three images (the shared ROWS' boxes as normalized cx, cy, w, h), five keypoints each."""
    cls = torch.zeros(3, m, dtype=torch.long)
    boxes = torch.rand(3, m, 4) * 3             # garbage in the padding
    kpts = torch.rand(3, m, k, 3) * 3
    mask = torch.zeros(3, m, dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    for i, rows in enumerate(ROWS):
        for j, (_, x1, y1, x2, y2) in enumerate(rows):
            boxes[i, j] = torch.tensor([(x1 + x2) / 128, (y1 + y2) / 128, (x2 - x1) / 64, (y2 - y1) / 64])
            u = torch.rand(k, 2, generator=gen)
            kpts[i, j, :, 0] = (x1 + u[:, 0] * (x2 - x1)) / 64
            kpts[i, j, :, 1] = (y1 + u[:, 1] * (y2 - y1)) / 64
            kpts[i, j, :, 2] = torch.tensor([2.0, 2.0, 1.0, 0.0, 2.0])
            mask[i, j] = True
    return cls, boxes, kpts, mask


def test_pose_loss_ignores_padding_and_trains_every_output(tiny):
    torch.manual_seed(0)
    net = YoloNASPoseNet(tiny, 1, 5).train()
    crit = YoloNASPoseLoss(1, (0.05,) * 5)
    out = net(torch.rand(3, 3, 64, 64))
    ref, items = crit((out, (64, 64)), *_pose_targets(3))
    for m in (4, 16):
        loss, other = crit((out, (64, 64)), *_pose_targets(m))
        torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)
        torch.testing.assert_close(other, items, rtol=1e-6, atol=1e-7)
    assert torch.isfinite(items).all() and (items > 0).all()
    ref.backward()
    for name in ("heads.head1.pose_pred.weight", "heads.head1.cls_pred.weight", "heads.head2.reg_pred.weight",
                 "backbone.stem.conv.branch_3x3.conv.weight"):
        g = net.get_parameter(name).grad
        assert g is not None and g.abs().sum() > 0, name
    empty = crit((out, (64, 64)), torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, 0, 4), torch.zeros(3, 0, 5, 3),
                 torch.zeros(3, 0, dtype=torch.bool))[1]
    assert torch.isfinite(empty).all() and (empty[1:] == 0).all()
    assert_no_host_sync(pose_loss_module.YoloNASPoseLoss, pose_loss_module.pose_oks, pose_loss_module.ciou_loss)


# -- predict --------------------------------------------------------------------------------------
def test_detect_predict_maps_boxes_back_to_the_image():
    model = LibreYOLO.new("yolonas", "s", nc=3, device="cpu", seed=0)
    image = np.random.default_rng(0).integers(0, 255, (90, 150, 3), dtype=np.uint8)
    res = model(image, conf=0.0, imgsz=96, max_det=50)
    r = res[0] if isinstance(res, list) else res
    d = r.boxes.data
    assert 0 < len(d) <= 50 and (d[:, 5] < 3).all()
    assert (d[:, [0, 2]] >= 0).all() and (d[:, [0, 2]] <= 150).all() and (d[:, [1, 3]] <= 90).all()


def test_pose_predict_gives_nms_thinned_instances_with_visibility(monkeypatch):
    model = LibreYOLO.new("yolonas", "n", task="pose", device="cpu", seed=0)
    assert isinstance(model, YoloNASPose) and model.names == {0: "person"} and model.num_keypoints == 17
    seen = []
    infer = model.infer
    monkeypatch.setattr(model, "infer", lambda x: seen.append(infer(x)) or seen[-1])
    image = np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8)
    res = model(image, conf=0.0, iou=0.5, imgsz=64)
    r = res[0] if isinstance(res, list) else res
    boxes, scores, _, kpts, vis = seen[0]
    assert boxes.shape == (1, 84, 4) and kpts.shape == (1, 84, 17, 2) and vis.shape == (1, 84, 17)
    from torchvision.ops import box_iou
    d = r.boxes.data
    iou = box_iou(d[:, :4], d[:, :4]).fill_diagonal_(0)
    assert len(d) > 0 and iou.max() <= 0.5                       # the NMS ran
    kp = r.keypoints.data
    assert kp.shape == (len(d), 17, 3)
    # each keypoint's conf is its predicted visibility (not its instance's score)
    top = int(scores[0].argmax())
    torch.testing.assert_close(kp[0, :, 2], vis[0, top])


def test_pose_checkpoint_round_trip(tmp_path):
    model = LibreYOLO.new("yolonas", "n", task="pose", device="cpu", seed=0)
    path = model.save(tmp_path / "p.pt")
    loaded = LibreYOLO(str(path), device="cpu")
    assert isinstance(loaded, YoloNASPose) and (loaded.size, loaded.nc, loaded.num_keypoints) == ("n", 1, 17)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x)[0][2], model.model(x)[0][2])


def test_obb_predict_gives_rotated_boxes_after_rotated_nms(monkeypatch):
    model = LibreYOLO.new("yolonas", "s", task="obb", device="cpu", seed=0, nc=3)
    assert isinstance(model, YoloNASOBB) and model.TASK == "obb" and model.imgsz == 1024
    assert model.SUPPORTS_CUDA_GRAPH and model.SUPPORTS_CUDA_GRAPH_TRAIN   # both proven on a GPU (docs/families.md)
    seen = []
    infer = model.infer
    monkeypatch.setattr(model, "infer", lambda x: seen.append(infer(x)) or seen[-1])
    image = np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8)
    res = model(image, conf=1e-6, iou=0.3, imgsz=96)
    r = res[0] if isinstance(res, list) else res
    xywhr, scores, cls = seen[0]
    assert xywhr.shape == (1, 189, 5) and scores.shape == cls.shape == (1, 189)
    assert (scores[0, :-1] >= scores[0, 1:]).all()                       # sorted by score
    assert (xywhr[..., 2] >= xywhr[..., 3]).all() and (xywhr[..., 4] >= 0).all() and (xywhr[..., 4] < math.pi).all()
    d = r.obb.data
    assert d.shape[1] == 7 and 0 < len(d) < 189 and (d[:, 6] < 3).all()     # the rotated NMS ran
    from libreyolo.tasks.obb.rotated import probiou
    same = d[:, None, 6] == d[None, :, 6]
    ov = probiou(d[:, None, :5].double(), d[None, :, :5].double()).fill_diagonal_(0)
    assert (ov[same] <= 0.3 + 1e-6).all()
    # a 96-wide image on a 96 px canvas (scale 1, top-left): the best candidate comes back unchanged
    torch.testing.assert_close(d[0, :6], torch.cat((xywhr[0, 0], scores[0, :1])))


def test_obb_angles_are_canonicalised_to_the_same_rectangles():
    from libreyolo.tasks.obb.rotated import xywhr_to_corners
    g = torch.Generator().manual_seed(0)
    rb = torch.cat((torch.rand(50, 2, generator=g) * 100, 1 + torch.rand(50, 2, generator=g) * 30,
                    (torch.rand(50, 1, generator=g) - 0.75) * math.pi), 1).double()
    c = canonical_rboxes(rb)
    assert (c[:, 2] >= c[:, 3]).all() and (c[:, 4] >= 0).all() and (c[:, 4] < math.pi).all()
    a, b = xywhr_to_corners(rb), xywhr_to_corners(c)
    # the same four corners (in some order)
    assert torch.cdist(a, b).min(-1).values.max() < 1e-6


def test_obb_checkpoint_round_trip_and_layout_sniffing(tmp_path):
    model = LibreYOLO.new("yolonas", "s", task="obb", device="cpu", seed=0, nc=2)
    path = model.save(tmp_path / "o.pt")
    loaded = LibreYOLO(str(path), device="cpu")
    assert isinstance(loaded, YoloNASOBB) and (loaded.size, loaded.nc, loaded.meta["task"]) == ("s", 2, "obb")
    sd = model.model.state_dict()
    assert YoloNASOBB._owns_own(sd) and not YoloNAS._owns_own(sd) and not YoloNASPose._owns_own(sd)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x)[0][0], model.model(x)[0][0])


def test_onnx_export_matches_eager_predict(tmp_path, one_thread):
    """Exported dynamic at 160 px, compared at 192 px on four images (detections one-to-one). The
    fixtures' fill saturates this head's class logits (ties everywhere, so the NMS order is the
    runtime's), so the class convs are scaled down to spread the scores first."""
    from export_parity import compare, filled_model, parity_images
    m = filled_model("yolonas", "s", 160)
    with torch.no_grad():
        for i in (1, 2, 3):
            head = m.model.heads.get_submodule(f"head{i}")
            head.cls_pred.weight.mul_(1e-3)
            head.cls_pred.bias.mul_(1e-3)
    path = m.export(file=tmp_path / "m.onnx", dynamic=True)
    o = LibreYOLO(str(path), device="cpu")
    assert (o.FAMILY, o.size, o.TASK) == ("yolonas", "s", "detect")
    rows = compare(m, o, parity_images(), 192)
    assert all(r["n"] > 0 for r in rows)


# -- two trainer epochs ---------------------------------------------------------------------------
@pytest.mark.slow
def test_two_epochs_on_shapes_raise_map(tmp_path):
    from libreyolo.data.synthetic import make_shapes_dataset
    data = str(make_shapes_dataset(tmp_path / "ds", n_train=32, n_val=8, imgsz=64, seed=0))
    model = LibreYOLO.new("yolonas", "s", nc=5, device="cpu", seed=0)
    before = model.val(data=data, imgsz=64, batch=8, workers=0, verbose=False)
    # 32 optimizer steps (batch 2) at a constant AdamW lr from the first step, raw weights (no EMA)
    model.train(data=data, epochs=2, imgsz=64, batch=2, workers=0, optimizer="AdamW", lr0=3e-3, lrf=1.0,
                warmup_epochs=0, ema=False, nbs=2, close_mosaic=2, seed=0, project=str(tmp_path / "runs"),
                name="d", verbose=False, plots=False, val=False)
    after = model.val(data=data, imgsz=64, batch=8, workers=0, verbose=False)
    assert after["map50"] > before["map50"], (before, after)


def test_obb_predicts_through_the_command_line(tmp_path, monkeypatch, capsys):
    from PIL import Image

    from libreyolo.cli import main
    monkeypatch.chdir(tmp_path)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8)).save("im.png")
    assert main(["predict", "model=yolonas-s-obb", "source=im.png", "imgsz=96", "save=false", "device=cpu",
                 "conf=0.001"]) == 0
    out = capsys.readouterr().out
    import re
    assert re.search(r"im\.png: 96x64, [\w-]+ \d\.\d\d", out), out    # at least one rotated box


def test_pose_visibility_logits_start_at_one_half_and_classes_at_the_prior():
    """A fresh pose network and init_for_training: each cls_pred's class rows at logit(0.01), its
    visibility rows (after the classes) at 0; every level's head; trained weights' rows untouched
    by building, rewritten only by init_for_training (which the trainer calls on untrained models)."""
    m = LibreYOLO.new("yolonas", "n", task="pose", nc=2, device="cpu", seed=0)
    m.reset_keypoints(5)
    prior = math.log(0.01 / 0.99)
    for i in (1, 2, 3):
        b = getattr(m.model.heads, f"head{i}").cls_pred.bias
        assert b.shape == (2 + 5,)
        assert torch.allclose(b[:2], torch.full((2,), prior)) and torch.equal(b[2:], torch.zeros(5))
        with torch.no_grad():
            b.fill_(3.0)
    assert m.init_for_training(m.model) == 6
    for i in (1, 2, 3):
        b = getattr(m.model.heads, f"head{i}").cls_pred.bias
        assert torch.allclose(b[:2], torch.full((2,), prior)) and torch.equal(b[2:], torch.zeros(5))
