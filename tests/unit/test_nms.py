"""Candidate selection and per-image class-aware NMS on hand-checkable cases."""
import torch

from libreyolo.ops.nms import nms_per_image, top_candidates


def case():
    # image 0: two overlapping boxes of class 1 (the weaker is suppressed), one of class 2
    # overlapping them (kept: other class), one far away below conf.
    boxes = torch.tensor([[[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10], [50, 50, 60, 60]],
                          [[5, 5, 15, 15], [30, 30, 40, 40], [5, 5, 15, 15], [0, 0, 1, 1]]], dtype=torch.float)
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.1], [0.6, 0.95, 0.5, 0.2]])
    cls = torch.tensor([[1, 1, 2, 0], [3, 3, 3, 3]])
    return boxes, scores, cls


def test_top_candidates_sorted_and_capped():
    b, s, c = top_candidates(*case(), k=3)
    assert s.shape == (2, 3) and torch.equal(s[1], torch.tensor([0.95, 0.6, 0.5]))
    assert torch.equal(b[1, 0], torch.tensor([30.0, 30, 40, 40])) and c[0, 0] == 1
    assert top_candidates(*case(), k=99)[1].shape == (2, 4)


def test_nms_per_image_class_aware():
    d = nms_per_image(*top_candidates(*case(), k=4), conf=0.25, iou=0.5)
    assert d[:, 0].tolist() == [0, 0, 1, 1]
    assert d[d[:, 0] == 0, 5].tolist() == [0.8999999761581421, 0.699999988079071]
    assert d[d[:, 0] == 0, 6].tolist() == [1.0, 2.0]
    assert d[d[:, 0] == 1, 5].tolist() == [0.949999988079071, 0.6000000238418579]


def test_nms_options():
    cand = top_candidates(*case(), k=4)
    assert len(nms_per_image(*cand, conf=0.25, iou=0.5, agnostic=True)) == 3  # class 2 box now suppressed
    only = nms_per_image(*cand, conf=0.25, iou=0.5, classes=[2])
    assert only[:, 6].tolist() == [2.0]
    assert len(nms_per_image(*cand, conf=0.25, iou=0.5, max_det=1)) == 2
    assert nms_per_image(*cand, conf=0.99).shape == (0, 7)


def test_nms_free_keeps_the_sorted_prefix():
    cand = top_candidates(*case(), k=4)
    d = nms_per_image(*cand, conf=0.25, iou=0.5, nms_free=True)
    assert d[:, 0].tolist() == [0, 0, 0, 1, 1, 1]      # overlapping boxes are NOT suppressed
    assert d[d[:, 0] == 1, 5].tolist() == [0.949999988079071, 0.6000000238418579, 0.5]
    assert len(nms_per_image(*cand, conf=0.25, nms_free=True, max_det=1)) == 2


def test_result_is_cpu_float32_even_when_empty():
    cand = top_candidates(*case(), k=4)
    for kw in ({}, {"conf": 0.99}):
        d = nms_per_image(*cand, **kw)
        assert d.device.type == "cpu" and d.dtype == torch.float32


def test_nan_scores_rank_last_and_never_pass_conf():
    """A NaN score sorts above every number in torch; it must not take a real candidate's place
    in the conf-passing prefix that NMS reads (nor reach the results)."""
    boxes, scores, cls = case()
    broken = scores.clone()
    broken[0, 3] = float("nan")     # the far box of image 0, below conf anyway
    broken[1, 3] = float("nan")
    b, s, c = top_candidates(boxes, broken, cls, k=3)
    assert not torch.isnan(s).any()
    assert torch.equal(s[1], torch.tensor([0.95, 0.6, 0.5]))      # every real candidate kept in the top 3
    full = top_candidates(boxes, broken, cls, k=4)
    assert torch.equal(full[1][:, -1], torch.tensor([float("-inf")] * 2))
    got = nms_per_image(*full, conf=0.25, iou=0.5)
    ref = nms_per_image(*top_candidates(*case(), k=4), conf=0.25, iou=0.5)
    assert torch.equal(got, ref)
    inf = scores.clone()
    inf[0, 0] = float("inf")   # infinities are kept as they are
    assert top_candidates(boxes, inf, cls, k=1)[1][0, 0] == float("inf")
