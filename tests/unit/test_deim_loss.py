"""DEIM's criterion: MAL by hand, MAL at perfect IoU, the D-FINE terms unchanged, a deim-n backward."""
from __future__ import annotations

import math

import torch
from test_detr_loss import NC, ROWS, _dn, _fake_outputs, _scene, _targets

from libreyolo.models.deim.model import Deim
from libreyolo.models.detr_common.loss import DeimLoss, DetrLoss, matchability_aware_loss, varifocal_loss
from libreyolo.models.dfine.model import Dfine
from libreyolo.models.rtdetrv4.model import RTDETRv4


def _bce(x: float, t: float) -> float:
    return max(x, 0.0) - x * t + math.log1p(math.exp(-abs(x)))


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _neg(x: float, g: float = 1.5) -> float:
    """A negative entry: weight p^gamma, target 0."""
    return _sig(x) ** g * _bce(x, 0.0)


def test_mal_by_hand():
    # q0 matched to class 0 with IoU 0.64, q1 to class 1 with IoU 0.25, q2 background
    logits = torch.tensor([[[0.5, -1.0], [2.0, 0.3], [-0.7, 1.2]]])
    labels = torch.tensor([[0, 1, 1]])
    iou = torch.tensor([[0.64, 0.25, 0.9]])          # q2's IoU is ignored (unmatched)
    pos = torch.tensor([[True, True, False]])
    got = matchability_aware_loss(logits, labels, iou, pos, gamma=1.5)
    # positives: target IoU^1.5 (0.512, 0.125) with weight 1
    q0 = _bce(0.5, 0.512) + _neg(-1.0)
    q1 = _neg(2.0) + _bce(0.3, 0.125)
    q2 = _neg(-0.7) + _neg(1.2)
    assert math.isclose(float(got), q0 + q1 + q2, rel_tol=1e-6)
    # mal_alpha scales only the negatives
    scaled = matchability_aware_loss(logits, labels, iou, pos, gamma=1.5, alpha=0.5)
    want = _bce(0.5, 0.512) + _bce(0.3, 0.125) + 0.5 * (_neg(-1.0) + _neg(2.0) + q2)
    assert math.isclose(float(scaled), want, rel_tol=1e-6)
    # a query outside ``valid`` contributes nothing
    masked = matchability_aware_loss(logits, labels, iou, pos, valid=torch.tensor([[True, False, False]]))
    assert math.isclose(float(masked), q0, rel_tol=1e-6)
    # unlike VFL, a low-IoU match keeps full weight on its positive entry: the gradient there is
    # sigmoid(x) - IoU^gamma, not IoU * (sigmoid(x) - IoU)
    x = logits.clone().requires_grad_()
    matchability_aware_loss(x, labels, iou, pos).backward()
    assert math.isclose(float(x.grad[0, 1, 1]), _sig(0.3) - 0.125, rel_tol=1e-6)


def test_mal_with_perfect_iou():
    logits = torch.tensor([[[1.3, -0.4, 0.2], [-2.0, 0.8, 2.5]]])
    labels = torch.tensor([[0, 2]])
    pos = torch.ones(1, 2, dtype=torch.bool)
    one = torch.ones(1, 2)
    # IoU 1: the positive target is 1 with weight 1, i.e. VFL with alpha 1 and the same gamma
    mal = matchability_aware_loss(logits, labels, one, pos, gamma=1.5)
    vfl = varifocal_loss(logits, labels, one, pos, alpha=1.0, gamma=1.5)
    torch.testing.assert_close(mal, vfl, rtol=0, atol=0)
    want = (_bce(1.3, 1.0) + _neg(-0.4) + _neg(0.2)) + (_neg(-2.0) + _neg(0.8) + _bce(2.5, 1.0))
    assert math.isclose(float(mal), want, rel_tol=1e-6)
    # confident and right: (almost) nothing to learn
    sure = torch.full((1, 2, 3), -20.0)
    sure[0, 0, 0] = sure[0, 1, 2] = 20.0
    assert float(matchability_aware_loss(sure, labels, one, pos)) < 1e-7


def test_deim_criterion_is_dfine_with_mal():
    targets, mask = _targets(ROWS, 8)
    dn = _dn(targets, mask, 6)
    out = _fake_outputs(3, 6, torch.Generator().manual_seed(1), fine=True, dn_meta=dn.meta)
    deim = DeimLoss(NC)
    assert deim.item_names == ("mal", "bbox", "giou", "fgl", "ddf") and deim.gamma == 1.5
    assert deim.weights["mal"] == 1.0 and deim.mal_alpha is None
    dl, di = deim(out, targets, mask)
    fl, fi = DetrLoss(NC, fine=True)(out, targets, mask)
    # same matching and box / FGL / DDF terms; only the class term differs
    torch.testing.assert_close(di[1:], fi[1:], rtol=0, atol=0)
    assert not torch.equal(di[0], fi[0]) and torch.isfinite(dl)
    dl.backward()
    for o in [out, *out["aux_outputs"], out["enc_outputs"], out["pre_outputs"], *out["dn_outputs"]]:
        assert o["pred_logits"].grad.abs().sum() > 0


def test_build_loss_per_family():
    m = Deim.new("n", nc=NC, device="cpu", seed=0)
    crit = m.build_loss()
    assert isinstance(crit, DeimLoss) and crit.item_names == ("mal", "bbox", "giou", "fgl", "ddf")
    # the families sharing D-FINE's network keep VFL
    for fam, size in ((Dfine, "n"), (RTDETRv4, "s")):
        c = fam.new(size, nc=NC, device="cpu", seed=0).build_loss()
        assert type(c) is DetrLoss and c.item_names == ("vfl", "bbox", "giou", "fgl", "ddf")


def test_deim_n_backward_at_64px():
    m = Deim.new("n", nc=NC, device="cpu", seed=0)
    net = m.model.train()
    x, t, mask = _scene([3, 1], 8)
    crit = m.build_loss()
    torch.manual_seed(0)
    loss, items = crit(m.train_forward(net, x, t, mask), t, mask)
    assert items.shape == (5,) and torch.isfinite(items).all() and torch.isfinite(loss)
    assert (items[:3] > 0).all()
    loss.backward()
    grads = [p.grad for p in net.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
