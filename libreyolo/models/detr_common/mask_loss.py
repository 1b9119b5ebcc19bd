"""Mask terms of DETR-style instance segmentation (the DETR-segmentation / Mask2Former line, as
D-FINE-seg uses them), on the queries the detection criterion matched.

For every output set that carries masks, each query matched to a ground-truth instance is
trained with two terms between its mask logits and the instance's bitmap, both on the grid of
the predicted masks (the mask feature's resolution; targets on another grid are resampled to
it: from a finer grid by area, so a target pixel is the fraction it covers, else bilinearly):

* ``mask_bce``: the sigmoid binary cross-entropy, averaged over the mask's counted pixels;
* ``mask_dice``: ``1 - (2 sum(p t) + 1) / (sum(p) + sum(t) + 1)``, ``p`` the sigmoid (DETR's
  smoothed dice, so an empty target with an empty prediction costs nothing).

``crop=True`` (D-FINE-seg's recipe, and the default here) counts only the pixels whose centres
lie inside the instance's ground-truth box, for both terms; predict cuts every mask to its box
(:func:`libreyolo.tasks.segment.task.crop_to_boxes`), so what lies outside is never shown.
``crop=False`` counts the whole grid (DETR, Mask2Former).

The loss is dense on the grid: no point sampling. Mask2Former samples 12,544 uncertain points
per mask to bound the memory of its 1/4-resolution masks on large inputs; here the grid is
stride 4 (a 640 input gives 160 x 160 = 25,600 pixels, twice Mask2Former's points), the masks
are built only for the matched queries (below), and a dense loss is exact and draws nothing
random (the validation loss is repeatable). Matching itself is the detection criterion's
(class and box costs, :mod:`.matcher`); the masks do not enter it.

Each set's terms are summed over its matched queries and normalised like its box terms: by the
number of target boxes for the Hungarian-matched sets, by ``boxes * groups`` for the
denoising layers. A set is supervised when its dict has either

* ``"pred_masks"`` (B, Q, h, w) mask **logits** (not probabilities), or
* ``"mask_embed"`` (B, Q, D), with ``"mask_feature"`` (B, D, h, w) in the set's own dict or else
  in the top-level output dict: the mask of query q is ``<mask_embed[q], mask_feature>``
  (:func:`.mask.query_masks`), plus ``"mask_bias"`` (a scalar tensor, found the same way) where
  there is one, and only the matched queries' masks are ever built.

Fixed shapes: per set, the ``P`` first matched queries of each image are gathered (``P`` =
the target row count for a Hungarian-matched set, at most one query per target; the denoising
positives' count for a denoising set), the unmatched ones weighted out.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .loss import DetrLoss, SetAssignment

__all__ = ["mask_terms", "matched_queries", "set_mask_terms", "DetrMaskLoss"]


def mask_terms(logits: Tensor, target: Tensor, weight: Tensor, inside: Tensor | None = None
               ) -> tuple[Tensor, Tensor]:
    """Summed BCE and dice of masks (not normalised).

    ``logits`` (..., h, w) mask logits, ``target`` (..., h, w) in [0, 1], ``weight`` (...) per
    mask (0 leaves it out), ``inside`` (..., h, w) bool: the counted pixels (default: all).
    Per mask, BCE is the mean over its counted pixels (0 when none is counted) and dice as in
    the module docstring over the same pixels. Returns ``(sum(weight * bce), sum(weight * dice))``.
    """
    logits, target = logits.float(), target.float()
    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    p = logits.sigmoid()
    if inside is not None:
        keep = inside.to(logits.dtype)
        bce, p, target = bce * keep, p * keep, target * keep
        count = keep.flatten(-2).sum(-1)
    else:
        count = torch.full(logits.shape[:-2], float(logits.shape[-2] * logits.shape[-1]), device=logits.device)
    bce = bce.flatten(-2).sum(-1) / count.clamp(min=1)
    p, target = p.flatten(-2), target.flatten(-2)
    dice = 1 - (2 * (p * target).sum(-1) + 1) / (p.sum(-1) + target.sum(-1) + 1)
    w = weight.to(logits.dtype)
    return (bce * w).sum(), (dice * w).sum()


def matched_queries(match: Tensor, limit: int) -> tuple[Tensor, Tensor]:
    """The first ``P = min(Q, limit)`` matched queries of each image, in query order, then
    unmatched ones to fill: ``match`` (B, Q) target row or -1 -> query indices (B, P) long and
    whether each is matched (B, P) bool. ``limit`` must bound the matches per image (else the
    extra ones are dropped)."""
    b, q = match.shape
    p = max(0, min(q, int(limit)))
    order = torch.arange(q, device=match.device, dtype=torch.float32) / max(q, 1)
    sel = ((match >= 0).float() * 2 - order).topk(p, dim=1).indices
    return sel, match.gather(1, sel) >= 0


def _set_logits(out: dict, outputs: dict, sel: Tensor) -> Tensor | None:
    """The (B, P, h, w) mask logits of the selected queries of one set (None: the set has no masks)."""
    if "pred_masks" in out:
        m = out["pred_masks"]
        return m.gather(1, sel[..., None, None].expand(-1, -1, *m.shape[-2:])).float()
    if "mask_embed" in out:
        e = out["mask_embed"]
        picked = e.gather(1, sel.unsqueeze(-1).expand(-1, -1, e.shape[-1])).float()
        feature = out["mask_feature"] if "mask_feature" in out else outputs["mask_feature"]
        logits = torch.einsum("bpc,bchw->bphw", picked, feature.float())
        bias = out["mask_bias"] if "mask_bias" in out else outputs.get("mask_bias")
        return logits if bias is None else logits + bias.float()
    return None


def set_mask_terms(out: dict, outputs: dict, match: Tensor, limit: int, targets: Tensor, gt_masks: Tensor,
                   input_size: tuple[int, int], crop: bool = True) -> tuple[Tensor, Tensor] | None:
    """Summed (BCE, dice) of one output set's matched queries (not normalised); None when the
    set carries no masks.

    ``out`` the set's dict, ``outputs`` the top-level dict (its ``mask_feature`` and ``mask_bias``
    serve the sets without their own), ``match`` (B, Q) target row or -1, ``limit`` the most
    matches an image can have, ``targets`` (B, M, 5) ``[cls, x1, y1, x2, y2]`` in input pixels,
    ``gt_masks`` (B, M, H, W) the instances' bitmaps (any grid covering the input), ``input_size``
    (h, w) of the network input.
    """
    sel, matched = matched_queries(match, limit)
    logits = _set_logits(out, outputs, sel)
    if logits is None:
        return None
    if sel.shape[1] == 0:
        zero = logits.sum() * 0
        return zero, zero
    h, w = logits.shape[-2:]
    rows = match.gather(1, sel).clamp(min=0)
    tgt = gt_masks.gather(1, rows[..., None, None].expand(-1, -1, *gt_masks.shape[-2:])).float()
    if tgt.shape[-2:] != (h, w):
        b, p, th, tw = tgt.shape
        flat = tgt.reshape(b * p, 1, th, tw)
        if th >= h and tw >= w:   # a finer grid: each mask pixel takes the covered fraction
            flat = F.adaptive_avg_pool2d(flat, (h, w))
        else:
            flat = F.interpolate(flat, size=(h, w), mode="bilinear", align_corners=False)
        tgt = flat.reshape(b, p, h, w).clamp(0, 1)
    inside = None
    if crop:
        box = targets[..., 1:5].float().gather(1, rows.unsqueeze(-1).expand(-1, -1, 4))       # (B, P, 4)
        sx, sy = w / float(input_size[1]), h / float(input_size[0])
        xs = torch.arange(w, device=logits.device, dtype=torch.float32) + 0.5
        ys = torch.arange(h, device=logits.device, dtype=torch.float32) + 0.5
        inx = (xs >= box[..., 0:1] * sx) & (xs <= box[..., 2:3] * sx)                          # (B, P, w)
        iny = (ys >= box[..., 1:2] * sy) & (ys <= box[..., 3:4] * sy)                          # (B, P, h)
        inside = iny.unsqueeze(-1) & inx.unsqueeze(-2)
    return mask_terms(logits, tgt, matched, inside)


class DetrMaskLoss(nn.Module):
    """A DETR set criterion plus the mask terms; ``forward(outputs, targets, mask, gt_masks) ->
    (loss, items)``, items ``detection.item_names + ("mask_bce", "mask_dice")``.

    ``detection`` is the family's :class:`~.loss.DetrLoss` (or a subclass): it matches and
    computes its terms unchanged (:meth:`~.loss.DetrLoss.terms`), and every set it supervised
    that carries masks (see the module docstring) adds ``weight_bce * BCE`` and ``weight_dice *
    dice`` with that set's assignment and normalisation. ``outputs`` is the network's training
    dict with ``input_size`` (as for :class:`~.loss.DetrLoss`); ``gt_masks`` (B, M, H, W) the
    instances' bitmaps in the rows of ``targets`` (the segment task's collate gives them at
    stride 4). Defaults: D-FINE-seg's weights (1 and 1) and box crop.
    """

    def __init__(self, detection: DetrLoss, *, weight_bce: float = 1.0, weight_dice: float = 1.0, crop: bool = True):
        super().__init__()
        self.detection = detection
        self.weight_bce, self.weight_dice, self.crop = float(weight_bce), float(weight_dice), bool(crop)
        self.item_names: tuple[str, ...] = tuple(detection.item_names) + ("mask_bce", "mask_dice")

    def forward(self, outputs: dict[str, Any], targets: Tensor, mask: Tensor, gt_masks: Tensor
                ) -> tuple[Tensor, Tensor]:
        if gt_masks.shape[:2] != targets.shape[:2]:
            raise ValueError(f"gt_masks {tuple(gt_masks.shape)} do not follow the target rows {tuple(targets.shape)}")
        dev = outputs["pred_logits"].device
        with torch.autocast(device_type=dev.type, enabled=False):
            tot, assignment = self.detection.terms(outputs, targets, mask.bool())
            bce, dice = self.mask_items(outputs, assignment, targets, gt_masks)
            items = torch.stack([tot[k] for k in self.detection.item_names] + [bce, dice])
        return items.sum(), items.detach()

    def mask_items(self, outputs: dict[str, Any], assignment: SetAssignment, targets: Tensor, gt_masks: Tensor
                   ) -> tuple[Tensor, Tensor]:
        """The weighted (BCE, dice) over every set of ``assignment`` that carries masks."""
        bce = dice = outputs["pred_logits"].new_zeros((), dtype=torch.float32)
        groups = [(assignment.sets, assignment.num_boxes, targets.shape[1])]
        if assignment.dn_sets:
            groups.append((assignment.dn_sets, assignment.num_dn, assignment.dn_limit))
        for sets, norm, limit in groups:
            for out, match in sets:
                t = set_mask_terms(out, outputs, match, limit, targets, gt_masks, outputs["input_size"], self.crop)
                if t is not None:
                    bce = bce + self.weight_bce * t[0] / norm
                    dice = dice + self.weight_dice * t[1] / norm
        return bce, dice
