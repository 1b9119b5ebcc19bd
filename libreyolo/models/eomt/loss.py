"""EoMT's training loss: Mask2Former's set criterion on every query block's prediction, and the
masked-attention annealing schedule.

For each output set (the final prediction and, while training, the intermediate one of every
query block - ``aux``), queries are matched one-to-one to the image's target segments by the
Hungarian algorithm (``scipy.optimize.linear_sum_assignment``) on Mask2Former's cost ``2 * (-p(class))
+ 5 * BCE + 5 * dice`` (EoMT's weights); then

* ``ce``: cross-entropy of every query's class logits against its matched class, no-object for
  the unmatched ones, weighted by the checkpoint's ``criterion.empty_weight`` (no object 0.1);
* ``mask_bce`` / ``mask_dice``: the matched queries' mask terms
  (:func:`libreyolo.models.detr_common.mask_loss.mask_terms`: BCE averaged over the mask's counted
  pixels, DETR's smoothed dice), divided by the number of target segments in the batch.

Masks are compared densely on the stride-4 grid of the predicted masks (the targets resampled to
it as the DETR mask loss does: area fractions from a finer grid): no point sampling, so the loss
draws nothing random and the validation loss repeats. The total is ``2 ce + 5 bce + 5 dice``
summed over the sets.

The three tasks give their targets in their own form (:class:`EomtLoss`'s ``kind``): semantic
class maps (each class present is one segment; ignored pixels are left out of the mask terms),
the segment task's boxes / row mask / bitmaps, the panoptic task's classes / row mask / bitmaps.

Annealing (EoMT's recipe, scaled to the run): each query block's masked-attention probability
goes from 1 to 0 in its own window of training progress, the blocks one after another, by a
polynomial of power 0.9; set per epoch through :meth:`EomtLoss.on_epoch`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..detr_common.mask_loss import mask_terms

__all__ = ["EomtLoss", "anneal_probs", "hungarian_match", "resample_targets"]

WEIGHT_CE, WEIGHT_MASK, WEIGHT_DICE = 2.0, 5.0, 5.0
ANNEAL_POWER = 0.9


def anneal_probs(blocks: int, epoch: int, epochs: int) -> list[float]:
    """The masked-attention probability of each of ``blocks`` query blocks at the start of
    ``epoch`` (0-based) of ``epochs``: block i anneals over progress ``[(i+1)/(K+2), (i+2)/(K+2)]``
    (EoMT's staggered windows), 1 before, 0 after."""
    t = epoch / max(1, epochs)
    width = 1.0 / (blocks + 2)
    out = []
    for i in range(blocks):
        start = (i + 1) * width
        f = min(1.0, max(0.0, (t - start) / width))
        out.append(0.0 if f >= 1.0 else (1.0 - f) ** ANNEAL_POWER)
    return out


def resample_targets(bitmaps: Tensor, hw: tuple[int, int]) -> Tensor:
    """(B, M, H, W) target masks on any grid -> (B, M, h, w) in [0, 1] on the predicted grid:
    area fractions from a finer grid, bilinear from a coarser one."""
    b, m, th, tw = bitmaps.shape
    t = bitmaps.float()
    if (th, tw) == tuple(hw) or m == 0:
        return t if m else t.new_zeros((b, 0, *hw))
    flat = t.reshape(b * m, 1, th, tw)
    if th >= hw[0] and tw >= hw[1]:
        flat = F.adaptive_avg_pool2d(flat, hw)
    else:
        flat = F.interpolate(flat, size=hw, mode="bilinear", align_corners=False)
    return flat.reshape(b, m, *hw).clamp(0, 1)


@torch.no_grad()
def hungarian_match(class_logits: Tensor, mask_logits: Tensor, cls: Tensor, masks: Tensor
                    ) -> tuple[Tensor, Tensor]:
    """One image: (Q, C+1) class logits, (Q, h, w) mask logits, (M,) target classes, (M, h, w)
    targets -> (query indices, target indices) of the optimal one-to-one assignment under
    Mask2Former's cost (class 2, mask BCE 5, dice 5)."""
    from scipy.optimize import linear_sum_assignment
    if cls.numel() == 0:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty
    prob = class_logits.float().softmax(-1)[:, cls]                                   # (Q, M)
    x = mask_logits.float().flatten(1)                                                  # (Q, P)
    t = masks.float().flatten(1)                                                        # (M, P)
    n = x.shape[1]
    pos = F.binary_cross_entropy_with_logits(x, torch.ones_like(x), reduction="none")
    neg = F.binary_cross_entropy_with_logits(x, torch.zeros_like(x), reduction="none")
    bce = (pos @ t.T + neg @ (1 - t).T) / n
    s = x.sigmoid()
    dice = 1 - (2 * s @ t.T + 1) / (s.sum(-1, keepdim=True) + t.sum(-1)[None] + 1)
    cost = WEIGHT_CE * -prob + WEIGHT_MASK * bce + WEIGHT_DICE * dice
    cost = torch.nan_to_num(cost, nan=0.0, posinf=1e10, neginf=-1e10).cpu()
    qi, ti = linear_sum_assignment(cost.numpy())
    return torch.as_tensor(qi, dtype=torch.long), torch.as_tensor(ti, dtype=torch.long)


class EomtLoss(nn.Module):
    """``forward(outputs, *targets) -> (loss, items)``, items ``(ce, mask_bce, mask_dice)`` (each
    summed over the output sets, weights applied).

    ``outputs``: the network's training dict (``pred_logits``, ``pred_masks``, ``aux``).
    ``kind`` names the targets' form: ``"semantic"`` (masks (B, S, S) int64, -1 ignored),
    ``"segment"`` (targets (B, M, 5), row mask (B, M), bitmaps (B, M, h, w)), ``"panoptic"``
    (classes (B, M), row mask (B, M), bitmaps (B, M, h, w)). ``class_weight`` the (nc + 1,)
    class weights (the network's ``criterion.empty_weight``); ``set_probs`` sets the network's
    masked-attention probabilities (annealing, :meth:`on_epoch`).
    """

    item_names = ("ce", "mask_bce", "mask_dice")

    def __init__(self, kind: str, nc: int, class_weight: Tensor, blocks: int,
                 set_probs: Callable[[list[float]], None] | None = None):
        super().__init__()
        if kind not in ("semantic", "segment", "panoptic"):
            raise ValueError(f"unknown EoMT loss kind {kind!r}")
        self.kind, self.nc, self.blocks = kind, int(nc), int(blocks)
        self.register_buffer("class_weight", class_weight.detach().clone().float())
        self._set_probs = set_probs
        self._probs: list[float] | None = None

    def on_epoch(self, epoch: int, epochs: int) -> bool:
        """Set this epoch's masked-attention probabilities; True when they changed."""
        probs = anneal_probs(self.blocks, epoch, epochs)
        changed = probs != self._probs
        self._probs = probs
        if changed and self._set_probs is not None:
            self._set_probs(probs)
        return changed

    # ------------------------------------------------------------------ targets
    def _targets(self, targets: tuple[Tensor, ...], hw: tuple[int, int]
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """-> classes (B, M) long, row mask (B, M) bool, masks (B, M, h, w), counted pixels or None."""
        if self.kind == "semantic":
            (maps,) = targets
            small = _nearest(maps, hw)                                                   # (B, h, w)
            inside = small >= 0
            b = small.shape[0]
            present = [torch.unique(small[i][inside[i]]) for i in range(b)]
            m = max([len(p) for p in present] + [0])
            cls = torch.zeros(b, m, dtype=torch.long, device=maps.device)
            valid = torch.zeros(b, m, dtype=torch.bool, device=maps.device)
            for i, p in enumerate(present):
                cls[i, :len(p)], valid[i, :len(p)] = p, True
            bitmaps = (small[:, None] == cls[:, :, None, None]) & valid[:, :, None, None]
            return cls, valid, bitmaps.float(), inside
        rows, valid, bitmaps = targets
        cls = rows[..., 0] if rows.dim() == 3 else rows
        return cls.long(), valid.bool(), resample_targets(bitmaps, hw), None

    # ------------------------------------------------------------------ loss
    def forward(self, outputs: dict, *targets: Tensor) -> tuple[Tensor, Tensor]:
        sets = [(outputs["pred_logits"], outputs["pred_masks"])] + list(outputs.get("aux", ()))
        dev = outputs["pred_logits"].device
        with torch.autocast(device_type=dev.type, enabled=False):
            hw = tuple(outputs["pred_masks"].shape[-2:])
            cls, valid, masks, inside = self._targets(targets, hw)
            num = valid.sum().float().clamp(min=1)
            ce = bce = dice = torch.zeros((), device=dev)
            for logits, mlogits in sets:
                c, b_, d = self._set_terms(logits.float(), mlogits.float(), cls, valid, masks, inside)
                ce = ce + c
                bce = bce + b_ / num
                dice = dice + d / num
            items = torch.stack((WEIGHT_CE * ce, WEIGHT_MASK * bce, WEIGHT_DICE * dice))
        return items.sum(), items.detach()

    def _set_terms(self, logits: Tensor, mlogits: Tensor, cls: Tensor, valid: Tensor, masks: Tensor,
                   inside: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        b, q = logits.shape[:2]
        target_cls = torch.full((b, q), self.nc, dtype=torch.long, device=logits.device)
        qs, ts, bs = [], [], []
        for i in range(b):
            rows = valid[i].nonzero().squeeze(1)
            qi, ti = hungarian_match(logits[i], mlogits[i], cls[i, rows], masks[i, rows])
            qi, ti = qi.to(logits.device), rows[ti.to(logits.device)]
            target_cls[i, qi] = cls[i, ti]
            qs.append(qi), ts.append(ti), bs.append(torch.full_like(qi, i))
        ce = F.cross_entropy(logits.transpose(1, 2), target_cls, weight=self.class_weight.to(logits.device))
        bi, qi, ti = torch.cat(bs), torch.cat(qs), torch.cat(ts)
        if qi.numel() == 0:
            zero = mlogits.sum() * 0
            return ce, zero, zero
        counted = None if inside is None else inside[bi]
        bce, dice = mask_terms(mlogits[bi, qi], masks[bi, ti], torch.ones(qi.shape, device=logits.device), counted)
        return ce, bce, dice


def _nearest(maps: Tensor, hw: tuple[int, int]) -> Tensor:
    """(B, S, S) class maps -> (B, h, w): the class at each cell's centre pixel."""
    if tuple(maps.shape[-2:]) == tuple(hw):
        return maps
    s_h, s_w = maps.shape[-2] / hw[0], maps.shape[-1] / hw[1]
    ys = ((torch.arange(hw[0], device=maps.device) + 0.5) * s_h).long().clamp(max=maps.shape[-2] - 1)
    xs = ((torch.arange(hw[1], device=maps.device) + 0.5) * s_w).long().clamp(max=maps.shape[-1] - 1)
    return maps[:, ys][:, :, xs]
