"""YOLO-NAS-R's training loss (models/yolonas/obb_loss.py): the rotated candidate region and
assignment, a hand-made case where the perfect prediction scores lowest, the loss alone turning a
wrong box and angle into the right one, gradients reaching every head parameter, padded targets
giving the unpadded loss bit for bit, and two trainer epochs on shapes-obb lifting rotated mAP."""
from __future__ import annotations

import math

import pytest
import torch
from loss_cases import assert_no_host_sync

from libreyolo import LibreYOLO
from libreyolo.models.common.assign import points_in_boxes
from libreyolo.models.yolonas import nn as ynn
from libreyolo.models.yolonas import obb_loss as obb_loss_module
from libreyolo.models.yolonas.obb import YoloNASOBB
from libreyolo.models.yolonas.obb_loss import (
    RotatedTaskAlignedAssigner,
    YoloNASOBBLoss,
    decode_rboxes,
    points_in_rboxes,
)
from libreyolo.models.yolonas.obb_nn import YoloNASOBBNet
from libreyolo.tasks.obb.rotated import polygon_iou, probiou

#: a small width/depth (every block type present), as tests/unit/test_yolonas.py's
TINY = ynn.YoloNASConfig(8, (16, 16, 32, 32), (1, 1, 1, 1), (8, 8, 16, 16), (True, False, False, False),
                         (16, 16, 16, 32), (1, 1), (8, 8), (1, 1), (8, 8), 0.125)
S = 64                                    # input side of the hand-made cases
HW = [(8, 8), (4, 4), (2, 2)]             # its three levels (strides 8, 16, 32): 84 anchors


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(ynn.CONFIGS, "tiny", TINY)
    return "tiny"


def _grid():
    points, strides, _ = ynn.anchor_grid(HW, ynn.STRIDES, torch.float32, torch.device("cpu"))
    return points, strides


def _two_hot_logits(t: torch.Tensor) -> torch.Tensor:
    """(...,) values in [0, REG_MAX) -> (..., REG_MAX + 1) logits whose expectation is the value."""
    left = t.floor().clamp(0, ynn.REG_MAX - 1).long()
    p = torch.zeros(*t.shape, ynn.REG_MAX + 1)
    p.scatter_(-1, left[..., None], (left + 1 - t)[..., None])
    p.scatter_(-1, (left + 1)[..., None], (t - left)[..., None])
    return (p + 1e-12).log()


def _raw(rbox: torch.Tensor, cls: int = 1, nc: int = 2) -> dict:
    """Head outputs for one 64 px image where every anchor predicts ``rbox`` (pixels) and the
    anchors inside it score ``cls`` high, all others low."""
    points, strides = _grid()
    n = len(points)
    size = rbox[2:4] / strides                                        # (N, 2) strides
    inside = points_in_rboxes(points * strides, rbox[None, None])[0, 0]
    logits = torch.full((n, nc), -6.0)
    logits[inside, cls] = 6.0
    return {"score_logits": logits[None], "size_dist": _two_hot_logits(size).reshape(1, n, -1),
            "size_reduced": size[None], "angles": rbox[4].expand(1, n, 1).clone(),
            "offsets": (rbox[:2] / strides - points)[None], "anchor_points": points, "strides": strides,
            "reg_max": ynn.REG_MAX}


def _targets(rows: list[list[list[float]]], m: int, garbage: bool = False):
    """Per-image ``[cls, cx, cy, w, h, angle]`` rows (pixels of a 64 px input) -> the obb task's
    padded (cls (B, m), boxes (B, m, 5) normalized, mask (B, m)); ``garbage`` fills the padding."""
    b = len(rows)
    g = torch.Generator().manual_seed(m)
    cls = torch.randint(0, 7, (b, m), generator=g) if garbage else torch.zeros(b, m, dtype=torch.long)
    boxes = torch.randn(b, m, 5, generator=g) * 3 if garbage else torch.zeros(b, m, 5)
    mask = torch.zeros(b, m, dtype=torch.bool)
    for i, r in enumerate(rows):
        for j, (c, *box) in enumerate(r):
            cls[i, j] = int(c)
            boxes[i, j] = torch.tensor(box) / torch.tensor([S, S, S, S, 1.0])
            mask[i, j] = True
    return cls, boxes, mask


#: three images: three objects (one steep, one thin), none, one large
ROWS = [[[0, 20, 22, 30, 12, 0.4], [1, 44, 40, 24, 8, 2.6], [1, 30, 50, 20, 18, 1.2]],
        [],
        [[0, 32, 32, 56, 30, 0.2]]]


# -- geometry and assignment ----------------------------------------------------------------------
def test_points_in_rotated_boxes():
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(2, 5, 2, generator=g) * 50
    wh = torch.rand(2, 5, 2, generator=g) * 30 + 1
    pts = torch.rand(200, 2, generator=g) * 80
    # angle 0: the axis-aligned test
    rb = torch.cat((xy, wh, torch.zeros(2, 5, 1)), -1)
    xyxy = torch.cat((xy - wh / 2, xy + wh / 2), -1)
    assert torch.equal(points_in_rboxes(pts, rb, 1e-9), points_in_boxes(pts, xyxy.unsqueeze(2), 1e-9))
    # a 20 x 4 box turned by 45 degrees: along its diagonal inside, off it outside
    box = torch.tensor([[[10.0, 10.0, 20.0, 4.0, math.pi / 4]]])
    p = torch.tensor([[16.0, 16.0], [4.0, 4.0], [13.0, 7.0], [10.0, 13.5], [19.0, 19.0]])
    assert points_in_rboxes(p, box)[0, 0].tolist() == [True, True, False, False, False]


def test_rotated_assigner_takes_the_top_k_anchors_inside_the_rotated_box():
    points, strides = _grid()
    pts = points * strides
    gt = torch.tensor([[[32.0, 32.0, 60.0, 12.0, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0]]])
    inside = points_in_rboxes(pts, gt[:, :1])[0, 0]
    assert 12 < int(inside.sum()) < 84                              # the thin box holds some anchors
    pred = gt[:, :1].expand(1, 84, 5).clone()                          # every anchor predicts the gt
    pred[0, :, :2] += torch.randn(84, 2, generator=torch.Generator().manual_seed(0))  # at varying quality
    scores = torch.full((1, 84, 2), 0.5)
    labels, boxes, soft, fg, gt_idx = RotatedTaskAlignedAssigner(topk=12)(
        scores, pred, pts, torch.tensor([[1, 0]]), gt, torch.tensor([[True, False]]))
    iou = probiou(gt[:, :1], pred)[0]
    assert int(fg.sum()) == 12 and not (fg[0] & ~inside).any()        # 12 positives, all inside
    chosen = iou[fg[0]]
    assert chosen.min() >= iou[inside & ~fg[0]].max()                   # the 12 best (equal scores)
    assert (labels[0][fg[0]] == 1).all() and (gt_idx[0][fg[0]] == 0).all()
    torch.testing.assert_close(boxes[0][fg[0]], gt[0, :1].expand(12, 5))
    # soft targets: the gt's best anchor gets its best ProbIoU, in the class channel only
    assert soft[0, :, 1].max().item() == pytest.approx(chosen.max().item(), rel=1e-5)
    assert soft[0, :, 0].abs().sum() == 0 and soft[0][~fg[0]].abs().sum() == 0


# -- hand-made case -------------------------------------------------------------------------------
def test_the_perfect_prediction_has_the_lowest_loss():
    gt = torch.tensor([28.0, 36.0, 40.0, 16.0, 0.6])
    crit = YoloNASOBBLoss(2)
    targets = _targets([[[1, *gt.tolist()]]], 2)

    def loss_of(pred):
        return crit(((None, _raw(pred)), (S, S)), *targets)

    perfect, items = loss_of(gt)
    decoded, _ = decode_rboxes(_raw(gt))
    torch.testing.assert_close(decoded[0], gt.expand(84, 5), rtol=0, atol=1e-4)   # decoded as the head does
    assert items[1] < 2e-3 and items[2] < 0.25, items                 # ProbIoU ~1; DFL at its two-hot floor
    for name, delta in (("shifted", [6.0, 0, 0, 0, 0]), ("rotated", [0, 0, 0, 0, 0.5]),
                        ("resized", [0, 0, 12.0, -4.0, 0]), ("turned back", [0, 0, 0, 0, -0.3])):
        worse, w_items = loss_of(gt + torch.tensor(delta))
        assert worse > perfect and w_items[1] > items[1] + 0.05, (name, worse, perfect, w_items, items)
    # the same rectangle turned by pi (the head's angle range is [-pi/4, 3pi/4)): the same loss
    same, _ = crit(((None, _raw(gt)), (S, S)), targets[0], targets[1] + torch.tensor([0, 0, 0, 0, math.pi]),
                   targets[2])
    torch.testing.assert_close(same, perfect, rtol=1e-4, atol=1e-5)


def test_the_loss_alone_moves_a_wrong_box_and_angle_onto_the_target():
    """Optimising the head's raw outputs (offsets, size logits, rotation logit, class logits) by
    the loss alone: the best-scoring anchor ends on the target rectangle, angle included."""
    gt = torch.tensor([30.0, 34.0, 40.0, 14.0, 2.0])
    points, strides = _grid()
    n = len(points)
    offsets = torch.zeros(1, n, 2, requires_grad=True)
    dist = _two_hot_logits(torch.full((1, n, 2), 2.0)).reshape(1, n, -1).requires_grad_(True)
    rot = torch.zeros(1, n, 1, requires_grad=True)                    # angle pi / 4, the middle of the range
    logits = torch.full((1, n, 2), -4.6, requires_grad=True)
    crit = YoloNASOBBLoss(2)
    targets = _targets([[[0, *gt.tolist()]]], 1)
    opt = torch.optim.Adam([offsets, dist, rot, logits], lr=0.05)

    def raw():
        return {"score_logits": logits, "size_dist": dist, "angles": (rot.sigmoid() - 0.25) * math.pi,
                "offsets": offsets, "anchor_points": points, "strides": strides}

    first = None
    for _ in range(200):
        loss, _ = crit(((None, raw()), (S, S)), *targets)
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.3 * first
    with torch.no_grad():
        boxes, _ = decode_rboxes(raw())
        best = logits[0, :, 0].argmax()
    got = boxes[0, best].double()
    assert polygon_iou(got[None].numpy(), gt[None].double().numpy())[0, 0] > 0.8, got
    assert abs(float(got[4]) - 2.0) < 0.1 and float(got[2]) > float(got[3])   # longer side first, as the target


# -- the network: gradients, padding, no objects --------------------------------------------------
def _tiny_out(tiny, seed=0):
    torch.manual_seed(seed)
    net = YoloNASOBBNet(tiny, 2).train()
    return net, (net(torch.rand(3, 3, S, S)), (S, S))


def test_gradients_reach_every_head_parameter(tiny):
    """With every candidate a positive (top-k = all 84 anchors) and a large box holding anchors of
    every level, each head parameter of the three levels gets a gradient."""
    net, out = _tiny_out(tiny)
    loss, items = YoloNASOBBLoss(2, topk=84)(out, *_targets(ROWS, 4))
    assert torch.isfinite(items).all() and (items > 0).all()
    loss.backward()
    for name, p in net.heads.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert net.get_parameter("backbone.stem.conv.branch_3x3.conv.weight").grad.abs().sum() > 0


def test_padded_targets_give_the_unpadded_loss_bit_for_bit(tiny):
    _, out = _tiny_out(tiny)
    crit = YoloNASOBBLoss(2)
    ref, ref_items = crit(out, *_targets(ROWS, 3))
    for m in (4, 16, 64):
        loss, items = crit(out, *_targets(ROWS, m, garbage=True))
        assert torch.equal(loss, ref) and torch.equal(items, ref_items), (m, items, ref_items)
    assert torch.isfinite(ref_items).all() and (ref_items > 0).all()
    # no objects: zero rows equal padding rows only; no box terms
    empty, e_items = crit(out, torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, 0, 5),
                          torch.zeros(3, 0, dtype=torch.bool))
    pad, _ = crit(out, *_targets([[], [], []], 16, garbage=True))
    assert torch.equal(empty, pad) and e_items[0] > 0 and (e_items[1:] == 0).all()
    assert_no_host_sync(obb_loss_module.YoloNASOBBLoss, obb_loss_module.RotatedTaskAlignedAssigner,
                        obb_loss_module.decode_rboxes, obb_loss_module.points_in_rboxes, probiou)


def test_autocast_outputs_give_a_float32_loss_and_bad_input_is_refused(tiny):
    _, out = _tiny_out(tiny)
    crit = YoloNASOBBLoss(2)
    t = _targets(ROWS, 4)
    (dec, raw), hw = out
    half = {k: (v.bfloat16() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in raw.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, items = crit(((dec, half), hw), *t)
    assert loss.dtype == items.dtype == torch.float32 and torch.isfinite(items).all()
    with pytest.raises(ValueError, match="square"):
        crit(((dec, raw), (64, 96)), *t)
    with pytest.raises(ValueError, match="5 values"):
        crit(out, t[0], t[1][..., :4], t[2])
    with pytest.raises(ValueError, match="expected 3"):
        YoloNASOBBLoss(3)(out, *t)


def test_the_model_builds_the_loss_and_feeds_it_bgr(tiny):
    model = LibreYOLO.new("yolonas", "s", task="obb", device="cpu", seed=0, nc=2)
    assert isinstance(model, YoloNASOBB) and isinstance(model.build_loss(), YoloNASOBBLoss)
    assert model.SUPPORTS_CUDA_GRAPH_TRAIN   # its GPU training rows passed (docs/families.md)
    net = YoloNASOBBNet(tiny, 2).eval()
    x = torch.rand(1, 3, S, S)
    with torch.no_grad():
        out, hw = model.train_forward(net, x)
        torch.testing.assert_close(out[0][0], net(x.flip(1))[0][0])
    assert hw == (S, S)


# -- two trainer epochs ---------------------------------------------------------------------------
@pytest.mark.slow
def test_two_epochs_on_shapes_obb_raise_rotated_map(tmp_path):
    """128 px (at 64 px most shapes are too thin to hold the centre of a stride-8 anchor, so they
    get no positives), 128 optimizer steps (batch 2) at a constant AdamW lr from the first step,
    raw weights (no EMA). About 1.5 minutes on one core."""
    from libreyolo.tasks.obb.synthetic import make_shapes_obb_dataset
    torch.manual_seed(0)
    data = str(make_shapes_obb_dataset(tmp_path / "so", n_train=128, n_val=8, imgsz=128, seed=0))
    model = LibreYOLO.new("yolonas", "s", task="obb", device="cpu", seed=0, nc=2)
    before = model.val(data=data, imgsz=128, batch=4, workers=0, verbose=False)
    model.train(data=data, epochs=2, imgsz=128, batch=2, workers=0, optimizer="AdamW", lr0=3e-3, lrf=1.0,
                warmup_epochs=0, ema=False, nbs=2, seed=0, project=str(tmp_path / "runs"), name="obb",
                verbose=False, plots=False, val=False)
    after = model.val(data=data, imgsz=128, batch=4, workers=0, verbose=False)
    assert after["map50"] > before["map50"] and after["map50_95"] > before["map50_95"], (before, after)
    reloaded = LibreYOLO(str(tmp_path / "runs" / "obb" / "weights" / "last.pt"), device="cpu")
    assert isinstance(reloaded, YoloNASOBB) and reloaded.names == {0: "rectangle", 1: "ellipse"}
