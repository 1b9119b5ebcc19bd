"""DETR Hungarian matcher: cost terms by hand, small assignments by hand, masks, empty targets."""
from __future__ import annotations

import math

import numpy as np
import torch
from torchvision.ops import box_convert, generalized_box_iou

from libreyolo.models.detr_common.matcher import (
    HungarianMatcher,
    hungarian_assign,
    matching_cost,
    pairwise_giou,
    union_assignment,
)


def _assign(cost: list, mask: list | None = None) -> list:
    """One image, one layer: cost (Q, M) -> assigned target row per query."""
    c = torch.tensor(cost, dtype=torch.float32)[None, None]
    m = torch.ones(1, c.shape[-1], dtype=torch.bool) if mask is None else torch.tensor([mask])
    return hungarian_assign(c, m)[0][0, 0].tolist()


def test_pairwise_giou_matches_torchvision_per_image():
    gen = torch.Generator().manual_seed(0)
    a = box_convert(torch.rand(3, 7, 4, generator=gen) * 0.5 + 0.1, "cxcywh", "xyxy")
    b = box_convert(torch.rand(3, 5, 4, generator=gen) * 0.5 + 0.1, "cxcywh", "xyxy")
    got = pairwise_giou(a, b)
    assert got.shape == (3, 7, 5)
    for i in range(3):
        torch.testing.assert_close(got[i], generalized_box_iou(a[i], b[i]))


def test_cost_terms_by_hand():
    # one query, one target: p = sigmoid(0.3) of the target's class
    logits = torch.tensor([[[0.3, -2.0]]])
    box = torch.tensor([[[0.5, 0.5, 0.2, 0.2]]])
    gt = torch.tensor([[[0.6, 0.5, 0.2, 0.2]]])
    cost = matching_cost(logits, box, torch.tensor([[0]]), gt)
    p = 1 / (1 + math.exp(-0.3))
    focal = 0.25 * (1 - p) ** 2 * -math.log(p + 1e-8) - 0.75 * p ** 2 * -math.log(1 - p + 1e-8)
    l1 = 0.1
    giou = 1 / 3          # inter 0.02, union 0.06, enclosing box 0.3 x 0.2 = the union -> no penalty
    assert math.isclose(float(cost), 2 * focal + 5 * l1 - 2 * giou, rel_tol=1e-5)
    # the other class: only the class term changes
    cost1 = matching_cost(logits, box, torch.tensor([[1]]), gt)
    q = 1 / (1 + math.exp(2.0))
    focal1 = 0.25 * (1 - q) ** 2 * -math.log(q + 1e-8) - 0.75 * q ** 2 * -math.log(1 - q + 1e-8)
    assert math.isclose(float(cost1 - cost), 2 * (focal1 - focal), rel_tol=1e-5)


def test_two_by_two_and_three_by_three_by_hand():
    assert _assign([[1.0, 2.0], [2.0, 1.0]]) == [0, 1]
    assert _assign([[3.0, 1.0], [1.0, 3.0]]) == [1, 0]
    # greedy would take the 0 at (1, 1) first and end at 0 + 3 + 3 = 6; the optimum is 1 + 2 + 2 = 5
    assert _assign([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]]) == [1, 0, 2]
    # negative costs (the GIoU term makes them common) are fine
    # (optimum -1 - 5 - 0.5 = -6.5; the runner-up (2, 1, 0) costs -5)
    assert _assign([[-1.0, -3.0, 0.0], [-2.0, -5.0, -1.0], [0.0, 0.0, -0.5]]) == [0, 1, 2]


def test_more_queries_than_targets_and_the_reverse():
    # 3 queries, 1 target: the cheapest query takes it, the others stay unmatched
    assert _assign([[5.0], [1.0], [3.0]]) == [-1, 0, -1]
    # 2 queries, 3 targets: every query is matched, one target is left over
    got = _assign([[1.0, 9.0, 2.0], [9.0, 9.0, 1.5]])
    assert got == [0, 2]


def test_padded_columns_never_match():
    # column 0 is padding with the cheapest cost of all: it is ignored, both queries want column 1
    assert _assign([[0.0, 5.0], [0.0, 1.0]], mask=[False, True]) == [-1, 1]
    # padding in the middle: target rows keep their original numbering
    assert _assign([[9.0, -5.0, 1.0], [2.0, -5.0, 9.0]], mask=[True, False, True]) == [2, 0]


def test_empty_targets_match_nothing():
    c = torch.randn(2, 3, 4, 5)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[1, 2] = True
    a, _ = hungarian_assign(c, mask)
    assert a.shape == (2, 3, 4) and a.dtype == torch.long
    assert (a[:, 0] == -1).all() and (a[:, 2] == -1).all()
    assert ((a[:, 1] == 2).sum(-1) == 1).all() and ((a[:, 1] >= 0).sum(-1) == 1).all()
    # no target rows at all
    a, _ = hungarian_assign(torch.zeros(1, 2, 4, 0), torch.zeros(2, 0, dtype=torch.bool))
    assert (a == -1).all() and a.shape == (1, 2, 4)


def test_non_finite_costs_do_not_break_the_solver():
    got = _assign([[float("nan"), 1.0], [0.0, float("inf")]])
    assert got == [1, 0]


def test_union_assignment_by_hand():
    # 3 layers, 1 image, 3 queries: query 0 -> target 0 twice, 1 once; query 1 -> 1 once, 0 once
    # (tie: the lower target row); query 2 never matched
    a = np.array([[[0, 1, -1]], [[0, 0, -1]], [[1, -1, -1]]])
    assert union_assignment(a).tolist() == [[0, 0, -1]]
    c = torch.tensor([[[[1.0, 2.0], [2.0, 1.0]]], [[[2.0, 1.0], [1.0, 2.0]]]])
    a, u = hungarian_assign(c, torch.ones(1, 2, dtype=torch.bool), union_of=[0, 1])
    assert a[:, 0].tolist() == [[0, 1], [1, 0]] and u.tolist() == [[0, 0]]


def test_matcher_recovers_a_permutation_across_layers():
    gen = torch.Generator().manual_seed(1)
    b, q, m, nc = 2, 10, 4, 3
    gt = torch.rand(b, m, 4, generator=gen) * 0.4 + 0.2
    labels = torch.randint(0, nc, (b, m), generator=gen)
    mask = torch.tensor([[True, True, True, False], [True, False, True, True]])
    perm = torch.stack([torch.randperm(q, generator=gen) for _ in range(b)])    # target j -> query perm[j]
    boxes = torch.rand(b, q, 4, generator=gen) * 0.1 + 0.85                      # far from every gt
    logits = torch.full((b, q, nc), -5.0)
    for i in range(b):
        for j in range(m):
            boxes[i, perm[i, j]] = gt[i, j]
            logits[i, perm[i, j], labels[i, j]] = 5.0
    match, _ = HungarianMatcher()([(logits, boxes), (logits, boxes)], labels, gt, mask)
    for layer in range(2):
        for i in range(b):
            want = torch.full((q,), -1, dtype=torch.long)
            for j in range(m):
                if mask[i, j]:
                    want[perm[i, j]] = j
            assert torch.equal(match[layer, i], want)
