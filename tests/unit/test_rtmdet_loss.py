"""RTMDet loss: IoU helper, QFL, dynamic soft-label assigner, padding, training signal, graph-safety."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import torchvision
from loss_cases import (
    ROWS,
    assert_autocast_computes_in_float32,
    assert_fixed_shapes_and_finite_backward,
    assert_graph_replay_matches_eager,
    assert_no_host_sync,
    assert_padding_invariant,
    assert_train_forward_is_normalised,
    cuda_batches,
    fit_one_batch,
    loss_without_objects,
    pad_gts,
    padded_targets,
    random_boxes,
    reference_dynamic_k,
)

from libreyolo import LibreYOLO
from libreyolo.models.common import assign as assign_module
from libreyolo.models.rtmdet import loss as loss_module
from libreyolo.models.rtmdet.loss import DynamicSoftLabelAssigner, RtmdetLoss, quality_focal_loss
from libreyolo.models.rtmdet.nn import RtmdetNet
from libreyolo.ops import iou as iou_module
from libreyolo.ops.iou import bbox_overlaps

NC = 3
SHAPES = ((8, 8), (4, 4), (2, 2))          # a 64x64 input at strides 8, 16, 32


def _outputs(b: int, gen: torch.Generator, nc: int = NC):
    """Random head outputs: logits, and positive pixel distances of a plausible size."""
    cls = [torch.randn(b, nc, h, w, generator=gen) for h, w in SHAPES]
    box = [torch.rand(b, 4, h, w, generator=gen) * 24 + 2 for h, w in SHAPES]
    return cls, box


def _grid(n: int = 8, stride: float = 8.0) -> tuple[torch.Tensor, torch.Tensor]:
    ys, xs = torch.meshgrid(torch.arange(n) * stride, torch.arange(n) * stride, indexing="ij")
    return torch.stack((xs.flatten(), ys.flatten()), 1).float(), torch.full((n * n, 1), stride)


# -- building blocks -----------------------------------------------------------------------
def test_bbox_overlaps_matches_torchvision_and_floors_the_union():
    gen = torch.Generator().manual_seed(0)
    a, b = random_boxes(30, gen), random_boxes(20, gen)
    torch.testing.assert_close(bbox_overlaps(a[:, None], b[None]), torchvision.ops.box_iou(a, b))
    torch.testing.assert_close(bbox_overlaps(a[:, None], b[None], mode="giou"),
                               torchvision.ops.generalized_box_iou(a, b))
    # two empty boxes: union and enclosing area floored at eps, so 0 (not NaN)
    z = torch.zeros(4)
    assert bbox_overlaps(z, z).item() == 0 and bbox_overlaps(z, z, mode="giou").item() == 0


def test_qfl_hand_values():
    x = torch.zeros(3)                                         # sigmoid = 0.5
    s = torch.tensor([0.8, 0.8, 0.0])
    pos = torch.tensor([True, False, True])
    got = quality_focal_loss(x, s, pos)
    # positive: BCE(0.5 vs 0.8) = ln 2 (any target at p = 0.5), times |0.8 - 0.5|^2
    # negative: BCE(0.5 vs 0) = ln 2, times 0.5^2; a positive with target 0 is the same
    want = torch.tensor([math.log(2) * 0.09, math.log(2) * 0.25, math.log(2) * 0.25])
    torch.testing.assert_close(got, want)
    x = torch.tensor([2.0])
    p = 1 / (1 + math.exp(-2))
    want = -(0.3 * math.log(p) + 0.7 * math.log(1 - p)) * (p - 0.3) ** 2
    assert quality_focal_loss(x, torch.tensor([0.3]), torch.tensor([True])).item() == pytest.approx(want, rel=1e-6)


# -- assigner ------------------------------------------------------------------------------
def _assign(pred, logits, gts, labels, valid=None, topk=13):
    points, strides = _grid()
    valid = torch.ones(gts.shape[:2], dtype=torch.bool) if valid is None else valid
    return DynamicSoftLabelAssigner(NC, topk=topk)(logits, pred, points, strides, labels, gts, valid)


def test_assigner_one_box_candidates_and_dynamic_k():
    points, _ = _grid()                                   # points at 0, 8, ..., 56 (offset 0)
    gt = torch.tensor([[[0.0, 0.0, 32.0, 32.0]]])
    # points strictly inside: 8, 16, 24 in x and y (0 lies on the edge) -> 9 candidates
    inside = ((points > 0) & (points < 32)).all(1)
    assert int(inside.sum()) == 9
    logits = torch.zeros(1, 64, NC)
    # every prediction is the gt: IoU 1, k = floor(9 * 1) = 9 -> all candidates, nothing else
    fg, labels, boxes, ious = _assign(gt[0].expand(64, 4)[None], logits, gt, torch.tensor([[2.0]]))
    assert torch.equal(fg[0], inside)
    assert (labels[0, fg[0]] == 2).all()
    torch.testing.assert_close(boxes[0, fg[0]], gt[0, 0].expand(9, 4))
    torch.testing.assert_close(ious[0, fg[0]], torch.ones(9))
    assert ious[0, ~fg[0]].abs().sum() == 0
    # every prediction has IoU 0.6: k = floor(9 * 0.6) = 5; equal class and IoU costs, so the soft
    # centre prior decides: the centre point (16, 16) and its four neighbours at one stride
    pred = torch.tensor([0.0, 0.0, 32.0, 19.2]).expand(1, 64, 4)
    fg, _, _, ious = _assign(pred, logits, gt, torch.tensor([[2.0]]))
    d = (points - 16).abs().sum(1)
    assert torch.equal(fg[0], d <= 8)
    torch.testing.assert_close(ious[0, fg[0]], torch.full((5,), 0.6))


def test_assigner_conflict_goes_to_least_cost():
    points, _ = _grid()
    gts = torch.tensor([[[0.0, 0.0, 40.0, 40.0], [16.0, 16.0, 64.0, 64.0]]])
    # every prior predicts a small box around itself; the prior at (24, 24) predicts gt B exactly
    pred = torch.cat((points - 6, points + 6), 1)
    k = int(((points[:, 0] == 24) & (points[:, 1] == 24)).nonzero())
    pred[k] = gts[0, 1]
    logits = torch.zeros(1, 64, NC)
    fg, labels, boxes, ious = _assign(pred[None], logits, gts, torch.tensor([[0.0, 1.0]]))
    assert bool(fg[0, k]) and int(labels[0, k]) == 1
    torch.testing.assert_close(boxes[0, k], gts[0, 1])
    assert ious[0, k].item() == pytest.approx(1.0)


def _reference_assign(logits, pred, points, strides, labels, gts, topk=13):
    """The original algorithm, per image with data-dependent shapes (eager only)."""
    n, g = points.shape[0], gts.shape[0]
    fg = torch.zeros(n, dtype=torch.bool)
    gt_idx = torch.zeros(n, dtype=torch.long)
    iou_out = torch.zeros(n)
    if g == 0:
        return fg, gt_idx, iou_out
    inside = torch.cat((points[:, None] - gts[None, :, :2], gts[None, :, 2:] - points[:, None]), -1).amin(-1) > 0
    cand = inside.any(1).nonzero().flatten()
    if cand.numel() == 0:
        return fg, gt_idx, iou_out
    x, p = logits[cand], pred[cand]
    iou = bbox_overlaps(p[:, None], gts[None])                                      # (V, G)
    centre = (gts[:, :2] + gts[:, 2:]) / 2
    dist = (points[cand][:, None] - centre[None]).pow(2).sum(-1).sqrt() / strides[cand]
    soft = F.one_hot(labels.long(), x.shape[-1]).float()[None] * iou[..., None]   # (V, G, C)
    xx = x[:, None].expand_as(soft)
    cls_cost = (F.binary_cross_entropy_with_logits(xx, soft, reduction="none")
                * (soft - xx.sigmoid()).abs().pow(2)).sum(-1)
    cost = cls_cost - torch.log(iou + 1e-7) * 3 + torch.pow(10, dist - 3)
    mm = reference_dynamic_k(cost, iou, topk)
    f = mm.sum(1) > 0
    fg[cand[f]] = True
    gt_idx[cand[f]] = mm[f].argmax(1)
    iou_out[cand[f]] = (mm * iou).sum(1)[f]
    return fg, gt_idx, iou_out


def test_assigner_matches_the_eager_reference():
    gen = torch.Generator().manual_seed(3)
    points, strides = _grid()
    for trial in range(6):
        g = 1 + trial % 4
        xy = torch.rand(g, 2, generator=gen) * 40
        gts = torch.cat((xy, xy + torch.rand(g, 2, generator=gen) * 40 + 4), 1)
        labels = torch.randint(0, NC, (g,), generator=gen).float()
        centre = points + torch.randn(64, 2, generator=gen) * 4
        pred = torch.cat((centre - torch.rand(64, 2, generator=gen) * 20 - 2,
                          centre + torch.rand(64, 2, generator=gen) * 20 + 2), 1)
        logits = torch.randn(64, NC, generator=gen) * 2
        fg, tl, tb, ious = DynamicSoftLabelAssigner(NC)(logits[None], pred[None], points, strides,
                                                       *pad_gts(gts, labels, 8, 7.0, gen))
        rfg, rgt, riou = _reference_assign(logits, pred, points, strides, labels, gts)
        assert rfg.any()
        assert torch.equal(fg[0], rfg), trial
        torch.testing.assert_close(tl[0, rfg], labels.long()[rgt[rfg]])
        torch.testing.assert_close(tb[0, rfg], gts[rgt[rfg]])
        torch.testing.assert_close(ious[0], riou)


# -- the loss ------------------------------------------------------------------------------
def test_loss_matches_the_original_formula():
    gen = torch.Generator().manual_seed(0)
    cls, box = _outputs(3, gen)
    crit = RtmdetLoss(NC)
    t, m = padded_targets(ROWS, 4, garbage=False)
    loss, items = crit((cls, box), t, m)
    points, strides = crit.prepare([c.shape for c in cls], "cpu")
    logits = torch.cat([c.flatten(2) for c in cls], 2).transpose(1, 2)
    dist = torch.cat([d.flatten(2) for d in box], 2).transpose(1, 2)
    pred = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)
    qfl_sum, giou_sum, avg = 0.0, 0.0, 0.0
    for i, rows in enumerate(ROWS):
        g = torch.tensor(rows, dtype=torch.float32).reshape(-1, 5)
        fg, gi, iou = _reference_assign(logits[i], pred[i], points, strides, g[:, 0], g[:, 1:])
        target = torch.zeros(64 + 16 + 4, NC)
        pos = torch.zeros_like(target, dtype=torch.bool)
        if fg.any():
            lab = g[gi[fg], 0].long()
            target[fg.nonzero().flatten(), lab] = iou[fg]
            pos[fg.nonzero().flatten(), lab] = True
            giou = torchvision.ops.generalized_box_iou(pred[i][fg].double(), g[gi[fg], 1:].double()).diagonal()
            giou_sum += float(((1 - giou) * iou[fg].double()).sum())
        p = logits[i].sigmoid()
        qfl = torch.where(pos, F.binary_cross_entropy_with_logits(logits[i], target, reduction="none")
                          * (target - p).abs() ** 2,
                          F.binary_cross_entropy_with_logits(logits[i], torch.zeros_like(p), reduction="none") * p ** 2)
        qfl_sum += float(qfl.sum())
        avg += float(iou.sum())
    avg = max(avg, 1.0)
    assert items[0].item() == pytest.approx(qfl_sum / avg, rel=1e-5)
    assert items[1].item() == pytest.approx(2.0 * giou_sum / avg, rel=1e-4)
    assert loss.item() == pytest.approx(items.sum().item(), rel=1e-6)


def test_padding_invariance():
    gen = torch.Generator().manual_seed(0)
    outputs = _outputs(3, gen)
    items = assert_padding_invariant(lambda t, m: RtmdetLoss(NC)(outputs, t, m))
    assert (items > 0).all()


def test_no_objects_at_all():
    gen = torch.Generator().manual_seed(0)
    outputs = _outputs(2, gen)
    crit = RtmdetLoss(NC)
    l0, i0 = loss_without_objects(lambda t, m: crit(outputs, t, m), 2)
    assert torch.isfinite(l0) and i0[1] == 0
    # QFL against all-zero targets, summed and divided by max(sum of IoUs, 1) = 1
    x = torch.cat([c.flatten() for c in outputs[0]])
    want = (F.binary_cross_entropy_with_logits(x, torch.zeros_like(x), reduction="none") * x.sigmoid() ** 2).sum()
    torch.testing.assert_close(i0[0], want)


def test_perfect_boxes_give_zero_giou():
    crit = RtmdetLoss(NC)
    points, _ = crit.prepare([(1, NC, h, w) for h, w in SHAPES], "cpu")
    gt = torch.tensor([4.0, 6.0, 40.0, 50.0])
    dist = torch.cat((points - gt[:2], gt[2:] - points), 1)               # every prior predicts the gt
    box, cls, start = [], [], 0
    for h, w in SHAPES:
        box.append(dist[start:start + h * w].T.reshape(1, 4, h, w))
        cls.append(torch.zeros(1, NC, h, w))
        start += h * w
    loss, items = crit((cls, box), *padded_targets([[[1, *gt.tolist()]]], 4))
    assert items[1].item() == pytest.approx(0.0, abs=1e-6)
    assert items[0] > 0


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_gradients_flow_with_fixed_output_shapes():
    gen = torch.Generator().manual_seed(2)
    cls, box = _outputs(3, gen)
    maps = [m.requires_grad_() for m in cls + box]
    crit = RtmdetLoss(NC)
    assert_fixed_shapes_and_finite_backward(lambda t, m: crit((maps[:3], maps[3:]), t, m), maps, 2)
    assert all(m.grad.abs().sum() > 0 for m in maps)


def test_graph_safe_source():
    assert_no_host_sync(loss_module, assign_module, iou_module)


def test_autocast_computes_in_float32():
    gen = torch.Generator().manual_seed(3)
    assert_autocast_computes_in_float32(RtmdetLoss(NC), _outputs(2, gen), padded_targets(ROWS[:1] + ROWS[2:], 8))


def test_model_declares_loss_and_normalised_train_forward():
    model = LibreYOLO.new("rtmdet", "t", nc=NC, device="cpu", seed=0)
    crit = model.build_loss()
    assert isinstance(crit, RtmdetLoss) and crit.item_names == ("qfl", "giou")
    assert_train_forward_is_normalised(model)


def _assigned_iou(crit: RtmdetLoss, outputs, targets, mask) -> float:
    """Mean IoU of the assigned predictions with their gts (how well the boxes fit)."""
    cls, box = outputs
    points, strides = crit.prepare([c.shape for c in cls], "cpu")
    logits = torch.cat([c.detach().flatten(2) for c in cls], 2).transpose(1, 2)
    dist = torch.cat([d.detach().flatten(2) for d in box], 2).transpose(1, 2)
    pred = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)
    fg, _, _, ious = crit.assigner(logits, pred, points, strides, targets[..., 0], targets[..., 1:], mask)
    return float(ious.sum() / fg.sum())


def test_tiny_net_fits_one_batch():
    # Trajectories differ across CPUs / thread counts (BatchNorm on a batch of 2), so the bars are
    # loose: here the loss ends near 0.03x its start and the assigned IoU goes 0.05 -> ~0.65.
    crit = RtmdetLoss(NC)
    losses, fit = fit_one_batch(lambda: RtmdetNet("t", nc=NC), crit, lambda p: torch.optim.AdamW(p, lr=0.002),
                                25, seed=0, probe=lambda out, t, m: _assigned_iou(crit, out, t, m))
    assert min(losses[-5:]) < 0.5 * losses[0], losses
    assert max(fit[-5:]) > max(0.3, 3 * fit[0]), fit


@pytest.mark.cuda
def test_cuda_graph_capture_matches_eager():
    """Capture loss forward+backward in a CUDA graph; replay with new targets == eager."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    crit = RtmdetLoss(NC)
    cls, box = _outputs(3, gen)
    maps = [m.to(dev).requires_grad_() for m in cls + box]
    crit.prepare([m.shape for m in maps[:3]], dev)
    assert_graph_replay_matches_eager(lambda t, m: crit((maps[:3], maps[3:]), t, m), maps, cuda_batches())
