"""PicoDet loss: VFL, DFL, GIoU, SimOTA assigner, padding, training signal, graph-safety."""
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
from libreyolo.models.picodet import loss as loss_module
from libreyolo.models.picodet.loss import PicodetLoss, SimOTAAssigner, distribution_focal_loss, varifocal_loss
from libreyolo.models.picodet.nn import PicodetNet
from libreyolo.ops import iou as iou_module
from libreyolo.ops.iou import bbox_giou, bbox_overlaps

NC = 3
R = 8                                               # reg_max + 1 bins
SHAPES = ((8, 8), (4, 4), (2, 2), (1, 1))          # a 64x64 input at strides 8, 16, 32, 64
N_PRIORS = sum(h * w for h, w in SHAPES)


def _outputs(b: int, gen: torch.Generator, nc: int = NC):
    cls = [torch.randn(b, nc, h, w, generator=gen) for h, w in SHAPES]
    box = [torch.randn(b, 4 * R, h, w, generator=gen) * 2 for h, w in SHAPES]
    return cls, box


def _grid(n: int = 8, stride: float = 8.0) -> tuple[torch.Tensor, torch.Tensor]:
    ys, xs = torch.meshgrid((torch.arange(n) + 0.5) * stride, (torch.arange(n) + 0.5) * stride, indexing="ij")
    return torch.stack((xs.flatten(), ys.flatten()), 1).float(), torch.full((n * n, 1), stride)


# -- building blocks -----------------------------------------------------------------------
def test_vfl_hand_values():
    x = torch.zeros(3)                                          # sigmoid = 0.5, BCE = ln 2 for any target
    t = torch.tensor([0.8, 0.0, 0.0])
    got = varifocal_loss(x, t)
    want = torch.tensor([math.log(2) * 0.8,                     # positive: weighted by its IoU target
                         math.log(2) * 0.75 * 0.25,             # negative: alpha * p^2
                         math.log(2) * 0.75 * 0.25])
    torch.testing.assert_close(got, want)
    p = 1 / (1 + math.exp(1.5))
    assert varifocal_loss(torch.tensor([-1.5]), torch.tensor([0.0])).item() == pytest.approx(
        -math.log(1 - p) * 0.75 * p ** 2, rel=1e-6)


def test_dfl_interpolates_between_bins():
    probs = torch.full((R,), 0.25 / 6)
    probs[3], probs[4] = 0.5, 0.25
    got = distribution_focal_loss(probs.log(), torch.tensor(3.3))
    assert got.item() == pytest.approx(0.7 * -math.log(0.5) + 0.3 * -math.log(0.25), rel=1e-5)
    assert distribution_focal_loss(probs.log(), torch.tensor(6.9)).item() == pytest.approx(
        0.1 * -math.log(0.25 / 6) + 0.9 * -math.log(0.25 / 6), rel=1e-5)


def test_paddle_giou_matches_torchvision():
    """PicoDet's box loss uses ops.iou.bbox_giou, PaddleDetection's GIoULoss convention."""
    gen = torch.Generator().manual_seed(0)
    a, b = random_boxes(40, gen), random_boxes(40, gen)
    torch.testing.assert_close(bbox_giou(a, b), torchvision.ops.generalized_box_iou(a, b).diagonal())
    assert bbox_giou(a[0], a[0]).item() == pytest.approx(1.0)


# -- assigner ------------------------------------------------------------------------------
def _assign(pred, scores, gts, labels, valid=None):
    points, strides = _grid()
    valid = torch.ones(gts.shape[:2], dtype=torch.bool) if valid is None else valid
    return SimOTAAssigner(NC)(scores, pred, points, strides, labels, gts, valid)


def test_assigner_one_box_dynamic_k():
    points, _ = _grid()                                   # cell centres 4, 12, ..., 60
    gt = torch.tensor([[[0.0, 0.0, 32.0, 32.0]]])
    inside = (points < 32).all(1)                         # 4x4 = 16 centres inside; the centre
    assert int(inside.sum()) == 16                        # square (16 +- 20) holds the same 16
    # inside priors predict the gt shortened in height: IoU 1 - 0.03 i; outside ones the gt itself
    pred = gt[0].expand(64, 4).clone()
    ii = inside.nonzero().flatten()
    f = 1 - 0.03 * torch.arange(16.0)
    pred[ii, 3] = 32 * f
    scores = torch.full((1, 64, NC), 0.5)
    fg, labels, boxes, pos_num = _assign(pred[None], scores, gt, torch.tensor([[2.0]]))
    # k = floor(sum of the 10 best candidate IoUs) = floor(10 - 0.03 * 45) = 8; with equal scores
    # the cost falls as the IoU rises, so the 8 best predictions are taken (never a non-candidate)
    assert fg[0].nonzero().flatten().tolist() == ii[:8].tolist()
    assert (labels[0, fg[0]] == 2).all() and pos_num.tolist() == [8]
    torch.testing.assert_close(boxes[0, fg[0]], gt[0, 0].expand(8, 4))


def test_assigner_small_box_gets_a_centre_prior():
    points, _ = _grid()
    gt = torch.tensor([[[13.0, 13.0, 19.0, 19.0]]])      # no cell centre inside the box
    pred = torch.cat((points - 3, points + 3), 1)
    k = int(((points[:, 0] == 20) & (points[:, 1] == 12)).nonzero())
    pred[k] = gt[0, 0]
    scores = torch.full((1, 64, NC), 0.5)
    fg, labels, boxes, pos_num = _assign(pred[None], scores, gt, torch.tensor([[1.0]]))
    # the candidates are the centre-square priors (cost + 1e8 each); k = max(1, floor(<2)) = 1
    assert fg[0].nonzero().flatten().tolist() == [k] and int(labels[0, k]) == 1
    torch.testing.assert_close(boxes[0, k], gt[0, 0])


def test_assigner_conflict_goes_to_least_cost():
    points, _ = _grid()
    gts = torch.tensor([[[0.0, 0.0, 40.0, 40.0], [16.0, 16.0, 64.0, 64.0]]])
    pred = torch.cat((points - 6, points + 6), 1)
    k = int(((points[:, 0] == 28) & (points[:, 1] == 28)).nonzero())
    pred[k] = gts[0, 1]
    scores = torch.full((1, 64, NC), 0.5)
    fg, labels, boxes, _ = _assign(pred[None], scores, gts, torch.tensor([[0.0, 1.0]]))
    assert bool(fg[0, k]) and int(labels[0, k]) == 1
    torch.testing.assert_close(boxes[0, k], gts[0, 1])


def _reference_assign(scores, pred, points, strides, labels, gts, topk=10):
    """PaddleDetection's SimOTA, per image with data-dependent shapes (eager only)."""
    n, g = points.shape[0], gts.shape[0]
    fg = torch.zeros(n, dtype=torch.bool)
    gt_idx = torch.zeros(n, dtype=torch.long)
    if g == 0:
        return fg, gt_idx, 0
    p, c = points[:, None], (gts[None, :, :2] + gts[None, :, 2:]) / 2
    in_box = torch.cat((p - gts[None, :, :2], gts[None, :, 2:] - p), -1).amin(-1) > 0
    rad = 2.5 * strides[:, None]
    in_ctr = torch.cat((p - (c - rad), (c + rad) - p), -1).amin(-1) > 0
    cand = (in_box.any(1) | in_ctr.any(1)).nonzero().flatten()
    both = (in_box & in_ctr)[cand]
    iou = bbox_overlaps(pred[cand][:, None], gts[None])
    giou = bbox_overlaps(pred[cand][:, None], gts[None], mode="giou")
    s = scores[cand][:, None].expand(-1, g, -1)
    t = F.one_hot(labels.long(), scores.shape[-1]).float()[None] * iou[..., None]
    fw = t * (t > 0) + 0.75 * (s - t).abs() ** 2 * (t <= 0)
    vfl = (F.binary_cross_entropy(s, t, reduction="none") * fw).sum(-1)
    cost = (vfl + 6 * (1 - giou)).double() + (~both).double() * 1e8   # 1e8 as a priority, not rounding
    mm = reference_dynamic_k(cost, iou, topk)
    f = mm.sum(1) > 0
    fg[cand[f]] = True
    gt_idx[cand[f]] = mm[f].argmax(1)
    return fg, gt_idx, max(int(f.sum()), 1)


def test_assigner_matches_the_eager_reference():
    gen = torch.Generator().manual_seed(3)
    points, strides = _grid()
    for trial in range(6):
        g = 1 + trial % 4
        xy = torch.rand(g, 2, generator=gen) * 48
        gts = torch.cat((xy, xy + torch.rand(g, 2, generator=gen) * 36 + 2), 1)
        labels = torch.randint(0, NC, (g,), generator=gen).float()
        centre = points + torch.randn(64, 2, generator=gen) * 4
        half = torch.rand(64, 4, generator=gen) * 20
        pred = torch.cat((centre - half[:, :2], centre + half[:, 2:]), 1)
        scores = torch.rand(64, NC, generator=gen)
        fg, tl, tb, pos_num = SimOTAAssigner(NC)(scores[None], pred[None], points, strides,
                                                 *pad_gts(gts, labels, 8, -3.0, gen))
        rfg, rgt, rnum = _reference_assign(scores, pred, points, strides, labels, gts)
        assert rfg.any()
        assert torch.equal(fg[0], rfg), trial
        torch.testing.assert_close(tl[0, rfg], labels.long()[rgt[rfg]])
        torch.testing.assert_close(tb[0, rfg], gts[rgt[rfg]])
        assert pos_num.tolist() == [rnum]


# -- the loss ------------------------------------------------------------------------------
def test_loss_matches_the_original_formula():
    gen = torch.Generator().manual_seed(0)
    cls, box = _outputs(3, gen)
    crit = PicodetLoss(NC)
    loss, items = crit((cls, box), *padded_targets(ROWS, 4))
    points, strides, bins = crit.prepare([c.shape for c in cls], "cpu")
    logits = torch.cat([c.flatten(2) for c in cls], 2).transpose(1, 2)
    dl = torch.cat([d.reshape(3, 4, R, -1) for d in box], 3).permute(0, 3, 1, 2)
    dist = (dl.softmax(-1) * bins).sum(-1)
    centres = points / strides
    pred = torch.cat((centres - dist[..., :2], centres + dist[..., 2:]), -1)
    vfl_sum, giou_sum, dfl_sum, wsum, npos = 0.0, 0.0, 0.0, 0.0, 0
    for i, rows in enumerate(ROWS):
        g = torch.tensor(rows, dtype=torch.float32).reshape(-1, 5)
        fg, gi, num = _reference_assign(logits[i].sigmoid(), pred[i] * strides, points, strides, g[:, 0], g[:, 1:])
        npos += num
        score = torch.zeros(N_PRIORS, NC)
        pos = fg.nonzero().flatten()
        if len(pos):
            tgt = g[gi[pos], 1:] / strides[pos]
            w = logits[i, pos].sigmoid().amax(-1)
            score[pos, g[gi[pos], 0].long()] = bbox_overlaps(pred[i, pos], tgt)
            giou_sum += float(((1 - torchvision.ops.generalized_box_iou(pred[i, pos], tgt).diagonal()) * w).sum())
            ltrb = torch.cat((centres[pos] - tgt[:, :2], tgt[:, 2:] - centres[pos]), 1).clamp(0, 6.9)
            lo = ltrb.floor().long()
            logp = dl[i, pos].log_softmax(-1)
            dfl = (-logp.gather(-1, lo[..., None])[..., 0] * (lo + 1 - ltrb)
                   - logp.gather(-1, lo[..., None] + 1)[..., 0] * (ltrb - lo))
            dfl_sum += float((dfl * w[:, None]).sum())
            wsum += float(w.sum())
        p = logits[i].sigmoid()
        fw = score * (score > 0) + 0.75 * (p - score).abs() ** 2 * (score <= 0)
        vfl_sum += float((F.binary_cross_entropy_with_logits(logits[i], score, reduction="none") * fw).sum())
    assert items[0].item() == pytest.approx(vfl_sum / max(npos, 1), rel=1e-5)
    assert items[1].item() == pytest.approx(2.0 * giou_sum / max(wsum, 1), rel=1e-4)
    assert items[2].item() == pytest.approx(0.25 * dfl_sum / 4 / max(wsum, 1), rel=1e-5)
    assert loss.item() == pytest.approx(items.sum().item(), rel=1e-6)


def test_padding_invariance():
    gen = torch.Generator().manual_seed(0)
    outputs = _outputs(3, gen)
    items = assert_padding_invariant(lambda t, m: PicodetLoss(NC)(outputs, t, m))
    assert (items > 0).all()


def test_no_objects_at_all():
    gen = torch.Generator().manual_seed(0)
    outputs = _outputs(2, gen)
    crit = PicodetLoss(NC)
    l0, i0 = loss_without_objects(lambda t, m: crit(outputs, t, m), 2)
    assert torch.isfinite(l0) and i0[1] == 0 and i0[2] == 0
    # VFL against all-zero targets: BCE(x, 0) * 0.75 * p^2, divided by max(0 positives, 1)
    x = torch.cat([c.flatten() for c in outputs[0]])
    bce = F.binary_cross_entropy_with_logits(x, torch.zeros_like(x), reduction="none")
    want = (bce * 0.75 * x.sigmoid() ** 2).sum()
    torch.testing.assert_close(i0[0], want)


def test_perfect_boxes_give_zero_giou_and_dfl():
    # gt (4, 4, 36, 36) is (0.5 .. 4.5) in stride-8 cells: from the 9 stride-8 cell centres inside
    # it (1.5, 2.5, 3.5) every distance is a whole bin, so one-hot distributions decode it exactly;
    # every other prior predicts a point (all mass on bin 0) and cannot compete.
    crit = PicodetLoss(NC)
    points, strides, _ = crit.prepare([(1, NC, h, w) for h, w in SHAPES], "cpu")
    gt = torch.tensor([4.0, 4.0, 36.0, 36.0])
    centres = points / strides
    ltrb = torch.cat((centres - gt[:2] / 8, gt[2:] / 8 - centres), 1)
    exact = (strides[:, 0] == 8) & (ltrb > 0).all(1)
    assert int(exact.sum()) == 9
    bins = torch.where(exact[:, None], ltrb.round().long(), 0)                    # (N, 4)
    logits = F.one_hot(bins, R).float() * 40                                      # (N, 4, R)
    box, cls, start = [], [], 0
    for h, w in SHAPES:
        box.append(logits[start:start + h * w].permute(1, 2, 0).reshape(1, 4 * R, h, w))
        cls.append(torch.zeros(1, NC, h, w))
        start += h * w
    loss, items = crit((cls, box), *padded_targets([[[1, *gt.tolist()]]], 4))
    assert items[1].item() == pytest.approx(0.0, abs=1e-5)
    assert items[2].item() == pytest.approx(0.0, abs=1e-5)
    # VFL: 9 positives with IoU 1 at class 1 -> ln 2 each; everything else ln 2 * 0.75 * 0.25
    want = (9 * math.log(2) + (N_PRIORS * NC - 9) * math.log(2) * 0.75 * 0.25) / 9
    assert items[0].item() == pytest.approx(want, rel=1e-5)


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_gradients_flow_with_fixed_output_shapes():
    gen = torch.Generator().manual_seed(2)
    cls, box = _outputs(3, gen)
    maps = [m.requires_grad_() for m in cls + box]
    crit = PicodetLoss(NC)
    assert_fixed_shapes_and_finite_backward(lambda t, m: crit((maps[:4], maps[4:]), t, m), maps, 3)
    assert all(m.grad.abs().sum() > 0 for m in maps[:4])               # VFL reaches every prior
    assert sum(m.grad.abs().sum() for m in maps[4:]) > 0                # boxes: the assigned levels


def test_graph_safe_source():
    assert_no_host_sync(loss_module, assign_module, iou_module)


def test_autocast_computes_in_float32():
    gen = torch.Generator().manual_seed(3)
    assert_autocast_computes_in_float32(PicodetLoss(NC), _outputs(2, gen), padded_targets(ROWS[:1] + ROWS[2:], 8))


def test_model_declares_loss_and_normalised_train_forward():
    model = LibreYOLO.new("picodet", "s", nc=NC, device="cpu", seed=0)
    crit = model.build_loss()
    assert isinstance(crit, PicodetLoss) and crit.item_names == ("vfl", "giou", "dfl")
    assert getattr(crit, "on_epoch", None) is None          # v1 recipe: nothing changes between epochs
    assert_train_forward_is_normalised(model)


def _assigned_iou(crit: PicodetLoss, outputs, targets, mask) -> float:
    """Mean IoU of the assigned predictions with their gts (how well the boxes fit)."""
    cls, box = outputs
    points, strides, bins = crit.prepare([c.shape for c in cls], "cpu")
    b = cls[0].shape[0]
    scores = torch.cat([c.detach().flatten(2) for c in cls], 2).transpose(1, 2).sigmoid()
    dl = torch.cat([d.detach().reshape(b, 4, R, -1) for d in box], 3).permute(0, 3, 1, 2)
    dist = (dl.softmax(-1) * bins).sum(-1) * strides
    pred = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)
    fg, _, boxes, _ = crit.assigner(scores, pred, points, strides, targets[..., 0], targets[..., 1:], mask)
    return float((bbox_overlaps(pred, boxes) * fg).sum() / fg.sum())


def test_tiny_net_fits_one_batch():
    # Loose bars (BatchNorm on a batch of 2 differs across CPUs / thread counts).
    crit = PicodetLoss(NC)
    losses, fit = fit_one_batch(lambda: PicodetNet("s", nc=NC), crit, lambda p: torch.optim.AdamW(p, lr=0.002),
                                25, seed=0, probe=lambda out, t, m: _assigned_iou(crit, out, t, m))
    assert min(losses[-5:]) < 0.5 * losses[0], losses
    assert max(fit[-5:]) > fit[0] + 0.15, fit


@pytest.mark.cuda
def test_cuda_graph_capture_matches_eager():
    """Capture loss forward+backward in a CUDA graph; replay with new targets == eager."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    crit = PicodetLoss(NC)
    cls, box = _outputs(3, gen)
    maps = [m.to(dev).requires_grad_() for m in cls + box]
    crit.prepare([m.shape for m in maps[:4]], dev)
    assert_graph_replay_matches_eager(lambda t, m: crit((maps[:4], maps[4:]), t, m), maps, cuda_batches())
