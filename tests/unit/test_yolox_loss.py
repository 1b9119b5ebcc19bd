"""YOLOX loss: SimOTA core (models/common/assign.py), assigner, loss terms, padding invariance,
graph-safety, training."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from loss_cases import (
    ROWS,
    assert_autocast_computes_in_float32,
    assert_fixed_shapes_and_finite_backward,
    assert_graph_replay_matches_eager,
    assert_no_host_sync,
    assert_padding_invariant,
    cuda_batches,
    fit_maps,
    loss_without_objects,
    padded_targets,
    random_boxes,
    reference_dynamic_k,
)

from libreyolo import LibreYOLO
from libreyolo.models.common import assign as assign_module
from libreyolo.models.common.assign import dynamic_k_matching, pairwise_class_cost
from libreyolo.models.yolox import loss as loss_module
from libreyolo.models.yolox.loss import SimOTAAssigner, YoloxLoss
from libreyolo.models.yolox.nn import YoloxNet
from libreyolo.ops import iou as iou_module
from libreyolo.ops.iou import bbox_iou

NC = 3
SIZES = (8, 4, 2)          # a 64x64 input at strides 8, 16, 32
STRIDES = (8, 16, 32)


def _maps(b: int, gen: torch.Generator, scale: float = 1.0) -> list[torch.Tensor]:
    return [torch.randn(b, 5 + NC, s, s, generator=gen) * scale for s in SIZES]


def _cells_and_strides() -> tuple[torch.Tensor, torch.Tensor]:
    cells, strides = [], []
    for s, n in zip(STRIDES, SIZES):
        gy, gx = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        cells.append(torch.stack((gx.flatten(), gy.flatten()), 1).float())
        strides.append(torch.full((n * n,), float(s)))
    return torch.cat(cells), torch.cat(strides)


# -- box utilities -----------------------------------------------------------------------------
def test_iou_matches_torchvision():
    import torchvision
    gen = torch.Generator().manual_seed(0)
    a, b = random_boxes(30, gen), random_boxes(20, gen)
    torch.testing.assert_close(bbox_iou(a[:, None], b[None]), torchvision.ops.box_iou(a, b))


# -- SimOTA core -------------------------------------------------------------------------------
def test_pairwise_class_cost_is_summed_bce():
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(2, 7, 5, generator=gen)
    probs[0, 0, 1] = 0.0                                   # log(0) is clamped at -100, as in F.bce
    labels = torch.tensor([[1, 4, 0], [2, 2, 3]])
    got = pairwise_class_cost(probs, labels)
    assert got.shape == (2, 3, 7)
    for b in range(2):
        for m in range(3):
            onehot = F.one_hot(labels[b, m], 5).float().expand(7, 5)
            want = F.binary_cross_entropy(probs[b], onehot, reduction="none").sum(-1)
            torch.testing.assert_close(got[b, m], want)


def _matching_by_hand(cost, ious, candidate, valid, topk=10):
    """The original's data-dependent matching, image by image, on its candidates and real gts."""
    out = torch.zeros_like(cost)
    for i in range(cost.shape[0]):
        g, c = valid[i].nonzero().flatten(), candidate[i].nonzero().flatten()
        if len(g) and len(c):
            mm = reference_dynamic_k(cost[i][g][:, c].T, ious[i][g][:, c].T, topk)
            out[i, g[:, None], c] = mm.T
    return out


def test_dynamic_k_matching_matches_loop_reference():
    gen = torch.Generator().manual_seed(3)
    for trial in range(5):
        cost = torch.rand(3, 6, 40, generator=gen) * 10               # distinct costs: no ties
        ious = torch.rand(3, 6, 40, generator=gen) * (0.3 + trial * 0.15)
        candidate = torch.rand(3, 40, generator=gen) < 0.6
        real = torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6, [0] * 6], dtype=torch.bool)
        matching, fg, gt_idx = dynamic_k_matching(cost, ious, candidate, real, 10)
        want = _matching_by_hand(cost, ious, candidate, real)
        torch.testing.assert_close(matching, want)
        assert torch.equal(fg, want.sum(1) > 0)
        assert torch.equal(gt_idx[fg], want.argmax(1)[fg])
        assert (matching.sum(1) <= 1).all()


def test_dynamic_k_and_conflict_by_hand():
    # one image, two gts, four candidates
    ious = torch.tensor([[[0.9, 0.8, 0.7, 0.1],      # sum 2.5 -> k = 2
                          [0.3, 0.2, 0.1, 0.1]]])    # sum 0.7 -> k = 1 (at least one)
    cost = torch.tensor([[[1.0, 2.0, 3.0, 4.0],      # gt 0 takes candidates 0 and 1
                          [5.0, 1.5, 9.0, 9.0]]])    # gt 1 takes candidate 1 -> conflict
    candidate, real = torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool)
    matching, fg, gt_idx = dynamic_k_matching(cost, ious, candidate, real, 10)
    # candidate 1 goes to the cheaper gt (1: cost 1.5 < 2.0); gt 0 keeps candidate 0
    assert matching[0].tolist() == [[1, 0, 0, 0], [0, 1, 0, 0]]
    assert fg[0].tolist() == [True, True, False, False]
    assert gt_idx[0, :2].tolist() == [0, 1]
    # a candidate that is not allowed is never taken, even if it is the cheapest
    candidate[0, 0] = False
    matching, fg, _ = dynamic_k_matching(cost, ious, candidate, real, 10)
    assert not fg[0, 0]


# -- assigner ----------------------------------------------------------------------------------
def test_assigner_single_gt_hand_checked():
    """gt (20, 20, 36, 36): centre (28, 28). Within 1.5 strides of it: 3x3 cells at stride 8,
    3x3 at stride 16, 2x2 at stride 32 (22 candidates). Four candidates predict boxes of known
    IoU (0.9, 0.8, 0.7, 0.2), the others tiny boxes; sum of the best 10 IoUs -> k = 2."""
    cells, strides = _cells_and_strides()
    centers = (cells + 0.5) * strides[:, None]
    gt = torch.tensor([[[20.0, 20.0, 36.0, 36.0]]])
    near = ((centers - 28).abs() < 1.5 * strides[:, None]).all(1)
    assert int(near.sum()) == 22 and int(near[:64].sum()) == 9 and int(near[64:80].sum()) == 9
    # every anchor predicts a 1x1 box at the gt centre (IoU 1/256) ...
    pred = torch.tensor([27.5, 27.5, 28.5, 28.5]).repeat(84, 1)
    # ... except four candidates: centred boxes of side 16*sqrt(q) have IoU q with the gt
    picks = near.nonzero().flatten()[[0, 5, 12, 20]]
    for idx, q in zip(picks.tolist(), (0.9, 0.8, 0.7, 0.2)):
        half = 8 * math.sqrt(q)
        pred[idx] = torch.tensor([28 - half, 28 - half, 28 + half, 28 + half])
    far = (~near).nonzero().flatten()[0]
    pred[far] = gt[0, 0]                                  # a perfect box outside the region: ignored
    cls = torch.zeros(1, 84, NC)
    obj = torch.zeros(1, 84)
    fg, gt_idx, miou = SimOTAAssigner(NC)(cls, obj, pred[None], centers, strides,
                                          torch.tensor([[1]]), gt, torch.tensor([[True]]))
    assert fg[0].nonzero().flatten().tolist() == picks[:2].tolist()
    torch.testing.assert_close(miou[0, picks[:2]], torch.tensor([0.9, 0.8]))
    assert (miou[0, ~fg[0]] == 0).all() and (gt_idx[0, fg[0]] == 0).all()


def test_assigner_box_prior_variant():
    """The paper-era prior: candidates are in the box OR within 2.5 strides of the centre, and
    only anchors in both escape the outside cost. gt (0, 0, 64, 20), centre (32, 10): the anchor
    at (60, 4) is in the box but 28 px (> 2.5 strides) from the centre."""
    cells, strides = _cells_and_strides()
    centers = (cells + 0.5) * strides[:, None]
    gt = torch.tensor([[[0.0, 0.0, 64.0, 20.0]]])
    pred = torch.cat((centers - 2, centers + 2), 1)[None]      # 4x4 boxes: IoU 16/1280 at best
    k = int(((centers[:, 0] == 60) & (centers[:, 1] == 4)).nonzero())
    j = int(((centers[:, 0] == 28) & (centers[:, 1] == 12)).nonzero())
    pred[0, k] = gt[0, 0]
    pred[0, j] = gt[0, 0]
    args = (torch.zeros(1, 84, NC), torch.zeros(1, 84), pred, centers, strides, torch.tensor([[0]]), gt,
            torch.tensor([[True]]))
    fg_box, _, _ = SimOTAAssigner(NC, center_radius=2.5, box_prior=True)(*args)
    fg_ctr, _, _ = SimOTAAssigner(NC)(*args)
    # centre prior: k is no candidate, k = floor(1 + 9 * 0.0125) = 1 -> only j
    assert fg_ctr[0].nonzero().flatten().tolist() == [j]
    # box prior: k is a candidate and counts towards k = floor(2 + 8 * 0.0125) = 2, but it costs
    # 1e6 more than any anchor in box and centre region, so j and one such anchor are taken
    assert int(fg_box.sum()) == 2 and fg_box[0, j] and not fg_box[0, k]


# -- the loss ----------------------------------------------------------------------------------
def _perfect_maps(box: list[float], b: int = 1) -> list[torch.Tensor]:
    """Maps whose every anchor predicts ``box`` exactly, objectness / classes at logit 0."""
    x1, y1, x2, y2 = box
    cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
    maps = []
    for s, n in zip(STRIDES, SIZES):
        m = torch.zeros(b, 5 + NC, n, n)
        gy, gx = torch.meshgrid(torch.arange(n).float(), torch.arange(n).float(), indexing="ij")
        m[:, 0] = cx / s - gx
        m[:, 1] = cy / s - gy
        m[:, 2] = math.log(w / s)
        m[:, 3] = math.log(h / s)
        maps.append(m)
    return maps


def test_perfect_prediction_has_zero_box_losses():
    box = [12.0, 20.0, 44.0, 36.0]
    crit = YoloxLoss(NC, use_l1=True)
    loss, items = crit(_perfect_maps(box), *padded_targets([[[2] + box]], 4))
    iou, obj, cls, l1 = items.tolist()
    assert iou < 1e-5 and l1 < 1e-5
    # the class target is one-hot x IoU (= 1): BCE of logit 0 against [0, 0, 1] is 3 * log 2
    assert cls == pytest.approx(3 * math.log(2), rel=1e-5)
    assert obj > 0 and loss.item() == pytest.approx(sum(items.tolist()), rel=1e-6)


def test_padding_rows_change_nothing():
    gen = torch.Generator().manual_seed(0)
    maps = _maps(3, gen)
    for use_l1 in (False, True):
        items = assert_padding_invariant(lambda t, m: YoloxLoss(NC, use_l1=use_l1)(maps, t, m))
        assert (items[:3] > 0).all() and (items[3] > 0) == use_l1


def test_no_targets_gives_objectness_only():
    gen = torch.Generator().manual_seed(1)
    maps = _maps(2, gen)
    crit = YoloxLoss(NC, use_l1=True)
    l0, i0 = loss_without_objects(lambda t, m: crit(maps, t, m), 2)
    obj = torch.cat([m[:, 4].flatten(1) for m in maps], 1)
    want = F.binary_cross_entropy_with_logits(obj, torch.zeros_like(obj), reduction="sum")   # / max(0, 1)
    assert i0[[0, 2, 3]].abs().sum() == 0
    torch.testing.assert_close(i0[1], want)
    torch.testing.assert_close(l0, want)


def test_normalised_by_foreground_count_not_batch():
    """YOLOX divides by the number of foregrounds and does not scale by the batch size: the
    same image twice gives the same loss as once."""
    gen = torch.Generator().manual_seed(2)
    maps = _maps(1, gen)
    crit = YoloxLoss(NC, use_l1=True)
    one = crit(maps, *padded_targets(ROWS[:1], 4))
    two = crit([torch.cat((m, m)) for m in maps], *padded_targets(ROWS[:1] * 2, 4))
    torch.testing.assert_close(two[0], one[0])
    torch.testing.assert_close(two[1], one[1])


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_gradients_flow_and_shapes_are_fixed():
    gen = torch.Generator().manual_seed(2)
    maps = [m.requires_grad_() for m in _maps(3, gen, scale=2.0)]
    crit = YoloxLoss(NC, use_l1=True)
    assert_fixed_shapes_and_finite_backward(lambda t, m: crit(maps, t, m), maps, 4)
    for m in maps:                                   # objectness everywhere; box / class on foregrounds
        assert m.grad[:, 4].abs().sum() > 0
    assert sum(m.grad[:, :4].abs().sum() for m in maps) > 0
    assert sum(m.grad[:, 5:].abs().sum() for m in maps) > 0


def test_on_epoch_switches_l1_for_the_last_15_epochs():
    crit = YoloxLoss(NC)
    flips = [crit.on_epoch(e, 20) for e in range(20)]
    assert flips == [False] * 5 + [True] + [False] * 14 and crit.use_l1
    assert crit.on_epoch(0, 20) is True and not crit.use_l1     # a new run starts without it
    short = YoloxLoss(NC)
    assert short.on_epoch(0, 3) is True and short.use_l1         # fewer epochs than 15: on from the start
    assert YoloxLoss(NC, l1_epochs=0).on_epoch(99, 100) is False


def test_autocast_computes_in_float32():
    gen = torch.Generator().manual_seed(3)
    assert_autocast_computes_in_float32(YoloxLoss(NC), _maps(2, gen), padded_targets(ROWS[:1] + ROWS[2:], 8))


def test_graph_safe_source():
    assert_no_host_sync(loss_module, assign_module, iou_module)


def test_loss_trains_the_maps():
    """Optimising the head maps directly drives the loss down (the assignment follows)."""
    losses = fit_maps(YoloxLoss(NC, use_l1=True), _maps(2, torch.Generator().manual_seed(4)))
    assert losses[-1] < 0.3 * losses[0], losses


def test_model_hooks():
    model = LibreYOLO.new("yolox", "n", nc=NC, device="cpu", seed=0)
    crit = model.build_loss()
    assert isinstance(crit, YoloxLoss) and crit.nc == NC and crit.item_names == ("iou", "obj", "cls", "l1")
    net = YoloxNet("n", NC).eval()
    x = torch.rand(1, 3, 64, 64)
    got = model.train_forward(net, x, None, None)
    want = net(x.flip(1) * 255.0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.cuda
def test_cuda_graph_capture_matches_eager():
    """Capture the loss forward+backward in a CUDA graph; replays with new targets == eager."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    crit = YoloxLoss(NC, use_l1=True)
    maps = [m.to(dev).requires_grad_() for m in _maps(3, gen)]
    crit.prepare([m.shape for m in maps], dev)
    assert_graph_replay_matches_eager(lambda t, m: crit(maps, t, m), maps, cuda_batches())
