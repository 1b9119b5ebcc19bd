"""The DETR set criterion (RT-DETR; D-FINE adds FGL and DDF; DEIM swaps VFL for MAL), on dense
per-query assignments.

What is supervised, every term normalised by the number of target boxes in the batch
(at least 1):

* every output set of the matching queries - the final decoder layer, each earlier layer
  (``aux_outputs``), D-FINE's first-layer boxes (``pre_outputs``) and the selected encoder
  proposals (``enc_outputs``) - matched to the targets by Hungarian matching
  (:mod:`.matcher`), one assignment per set;
* the denoising outputs (``dn_outputs``, every layer, and D-FINE's ``dn_pre_outputs``), matched
  by construction (:mod:`.denoising`) and normalised by ``boxes * groups``; padded denoising
  slots are left out of every term (the reference scores them as background in the class loss).

Terms: VFL (varifocal: BCE against ``IoU x one-hot`` on matched queries, background elsewhere,
weighted ``alpha * p^gamma`` on the background entries; alpha 0.75, gamma 2, weight 1), L1 on
normalised cxcywh (weight 5) and 1 - GIoU (weight 2). With ``fine=True`` (D-FINE, DEIM,
RT-DETRv4, ...), as D-FINE does: the box terms of the matching sets use the union ("GO") of all
the sets' assignments; FGL (weight 0.15), the distribution focal loss of each layer's edge
distributions (``pred_corners``) against the target edges expressed in the bins of W(n) around
the layer's initial boxes (``ref_points``), weighted by the IoU; DDF (weight 1.5), the
temperature-5 KL divergence of every earlier layer's edge distributions from the final layer's,
weighted by IoU on matched queries and by the final layer's confidence elsewhere, the two
averages balanced by the square roots of their element counts.

DEIM (:class:`DeimLoss`) keeps the D-FINE recipe and weights and swaps VFL for MAL, the
matchability-aware loss (item ``"mal"``, weight 1): on the matched entry the BCE target is
``IoU^gamma`` with weight 1, on every other entry the target is 0 with weight ``p^gamma``
(gamma 1.5, no alpha unless ``mal_alpha`` is given), as in DEIM's configs.

Everything after the assignment is fixed-shape (gathers and masks); only the Hungarian step
reads values on the host (one transfer per batch). Computed in float32 with autocast off.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_convert, generalized_box_iou_loss

from ...ops.iou import bbox_iou
from .dfine_decoder import weighting_function
from .matcher import HungarianMatcher

__all__ = ["DetrLoss", "DeimLoss", "SetAssignment", "varifocal_loss", "matchability_aware_loss", "box_losses",
           "edge_distances", "bin_targets", "fine_grained_localization_loss", "decoupled_distillation_loss",
           "normalized_targets"]


# ----------------------------------------------------------------------------- the terms
def varifocal_loss(logits: Tensor, labels: Tensor, iou: Tensor, pos: Tensor, *, alpha: float = 0.75,
                   gamma: float = 2.0, valid: Tensor | None = None) -> Tensor:
    """Summed varifocal loss of (B, Q, nc) logits (not normalised).

    ``labels`` (B, Q) long (read where ``pos``), ``iou`` (B, Q) the quality target of matched
    queries (detached), ``pos`` (B, Q) bool matched queries, ``valid`` (B, Q) bool queries that
    count at all (default: every query). The target of class c at query q is ``iou`` for its
    matched class, 0 elsewhere; the weight ``alpha * sigmoid^gamma`` (detached) on zero-target
    entries and the target itself on the matched entry.
    """
    onehot = F.one_hot(labels.clamp(0, logits.shape[-1] - 1), logits.shape[-1]).to(logits.dtype)
    onehot = onehot * pos.unsqueeze(-1).to(logits.dtype)
    score = onehot * iou.detach().unsqueeze(-1).to(logits.dtype)
    prob = logits.detach().sigmoid()
    weight = alpha * prob.pow(gamma) * (1 - onehot) + score
    loss = F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="none")
    if valid is not None:
        loss = loss * valid.unsqueeze(-1).to(loss.dtype)
    return loss.sum()


def matchability_aware_loss(logits: Tensor, labels: Tensor, iou: Tensor, pos: Tensor, *, gamma: float = 1.5,
                             alpha: float | None = None, valid: Tensor | None = None) -> Tensor:
    """Summed matchability-aware loss (DEIM's MAL) of (B, Q, nc) logits (not normalised).

    Arguments as :func:`varifocal_loss`. The matched class of a matched query is a positive with
    soft target ``iou^gamma`` and weight 1 (so a low-IoU match is still pushed up, unlike VFL
    where the weight shrinks with the IoU); every other entry is a negative with target 0 and
    weight ``p^gamma`` (``alpha * p^gamma`` when ``alpha`` is given; DEIM's default is none).
    ``p`` is the detached sigmoid score.
    """
    onehot = F.one_hot(labels.clamp(0, logits.shape[-1] - 1), logits.shape[-1]).to(logits.dtype)
    onehot = onehot * pos.unsqueeze(-1).to(logits.dtype)
    quality = iou.detach().to(logits.dtype).clamp(min=0).pow(gamma)
    score = onehot * quality.unsqueeze(-1)
    neg = logits.detach().sigmoid().pow(gamma) * (1 - onehot)
    if alpha is not None:
        neg = alpha * neg
    loss = F.binary_cross_entropy_with_logits(logits, score, weight=neg + onehot, reduction="none")
    if valid is not None:
        loss = loss * valid.unsqueeze(-1).to(loss.dtype)
    return loss.sum()


def box_losses(boxes: Tensor, target: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
    """Summed L1 (over the 4 cxcywh coordinates) and 1 - GIoU of matched queries (not normalised).

    ``boxes`` / ``target`` (B, Q, 4) normalised cxcywh, ``pos`` (B, Q) bool. Unmatched queries are
    compared with themselves (detached), so no degenerate box enters the arithmetic.
    """
    p = pos.unsqueeze(-1)
    target = torch.where(p, target, boxes.detach())
    w = pos.to(boxes.dtype)
    l1 = ((boxes - target).abs().sum(-1) * w).sum()
    giou = generalized_box_iou_loss(box_convert(boxes, "cxcywh", "xyxy"), box_convert(target, "cxcywh", "xyxy"),
                                    reduction="none", eps=1e-7)
    return l1, (giou * w).sum()


def edge_distances(ref: Tensor, target_xyxy: Tensor, reg_scale: Tensor) -> Tensor:
    """Target box edges as D-FINE offsets from a reference box: (..., 4) (left, top, right,
    bottom) in units of W(n), the inverse of the decoder's ``distance_to_box``."""
    rs = reg_scale.abs()
    cx, cy, w, h = ref.unbind(-1)
    sx, sy = w / rs + 1e-16, h / rs + 1e-16
    return torch.stack([(cx - target_xyxy[..., 0]) / sx, (cy - target_xyxy[..., 1]) / sy,
                        (target_xyxy[..., 2] - cx) / sx, (target_xyxy[..., 3] - cy) / sy], -1) - 0.5 * rs


def bin_targets(dist: Tensor, project: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Split each offset between its two neighbouring bins of ``project`` (W(n), increasing).

    Returns (left bin index long, weight of the right bin, weight of the left bin), all shaped
    like ``dist``. Below the first bin: all weight on bin 0; at or beyond the last: all on the
    last bin (as D-FINE's ``translate_gt``).
    """
    reg_max = project.numel() - 1
    idx = (project <= dist.unsqueeze(-1)).sum(-1) - 1
    left = idx.clamp(0, reg_max - 1)
    lo, hi = project[left], project[left + 1]
    right_w = (dist - lo) / (hi - lo)
    right_w = torch.where(idx < 0, torch.zeros_like(right_w), right_w)
    right_w = torch.where(idx >= reg_max, torch.ones_like(right_w), right_w)
    return left, right_w, 1 - right_w


def fine_grained_localization_loss(corners: Tensor, ref: Tensor, target_xyxy: Tensor, weight: Tensor,
                                   pos: Tensor, project: Tensor, reg_scale: Tensor) -> Tensor:
    """Summed FGL (D-FINE's distribution focal loss on the edge bins; not normalised).

    ``corners`` (B, Q, 4 * (R + 1)) edge logits, ``ref`` (B, Q, 4) the layer's initial boxes
    (cxcywh), ``target_xyxy`` (B, Q, 4), ``weight`` (B, Q) per-query weight (the IoU), ``pos``
    (B, Q) bool. Each edge: ``-(w_left log p[left] + w_right log p[left + 1])``.
    """
    b, q, _ = corners.shape
    logp = F.log_softmax(corners.reshape(b, q, 4, -1), -1)
    with torch.no_grad():
        left, w_right, w_left = bin_targets(edge_distances(ref.detach(), target_xyxy, reg_scale), project)
    ce = -(logp.gather(-1, left.unsqueeze(-1)).squeeze(-1) * w_left
           + logp.gather(-1, (left + 1).unsqueeze(-1)).squeeze(-1) * w_right)             # (B, Q, 4)
    return (ce * (weight.detach() * pos.to(weight.dtype)).unsqueeze(-1)).sum()


def decoupled_distillation_loss(corners: Tensor, teacher_corners: Tensor, teacher_logits: Tensor,
                                iou: Tensor, pos: Tensor, valid: Tensor, num_pos: Tensor, num_neg: Tensor,
                                temperature: float = 5.0) -> Tensor:
    """DDF: KL(teacher || layer) of the edge distributions at temperature T, times T^2.

    ``corners`` / ``teacher_corners`` (B, Q, 4 * (R + 1)) (the teacher is detached),
    ``teacher_logits`` (B, Q, nc), ``iou`` (B, Q) the layer's IoU with the matched target,
    ``pos`` (B, Q) matched, ``valid`` (B, Q) counted queries. Weight per edge: ``iou`` where
    matched, the teacher's max sigmoid score elsewhere. The matched and unmatched means are
    balanced by ``num_pos`` / ``num_neg`` (D-FINE: the square roots of the element counts
    scaled to a batch of 32).
    """
    b, q, _ = corners.shape
    logp = F.log_softmax(corners.reshape(b, q, 4, -1) / temperature, -1)
    target = F.softmax(teacher_corners.detach().reshape(b, q, 4, -1) / temperature, -1)
    kl = F.kl_div(logp, target, reduction="none").sum(-1) * temperature ** 2             # (B, Q, 4)
    conf = teacher_logits.detach().sigmoid().max(-1).values
    w = torch.where(pos, iou.detach(), conf).unsqueeze(-1)
    pos4 = pos.unsqueeze(-1).expand_as(kl).to(kl.dtype)
    neg4 = (valid & ~pos).unsqueeze(-1).expand_as(kl).to(kl.dtype)
    loss_pos = (w * kl * pos4).sum() / pos4.sum().clamp(min=1)
    loss_neg = (w * kl * neg4).sum() / neg4.sum().clamp(min=1)
    return (loss_pos * num_pos + loss_neg * num_neg) / (num_pos + num_neg).clamp(min=1e-12)


def normalized_targets(targets: Tensor, size: tuple[int, int], nc: int) -> tuple[Tensor, Tensor]:
    """(B, M, 5) ``[cls, x1, y1, x2, y2]`` in pixels of an (h, w) input -> labels (B, M) long
    clamped to [0, nc) and boxes (B, M, 4) normalised cxcywh (Python-scalar scaling: nothing is
    copied from the host)."""
    h, w = float(size[0]), float(size[1])
    t = targets.float()
    xyxy = torch.stack([t[..., 1] / w, t[..., 2] / h, t[..., 3] / w, t[..., 4] / h], -1)
    return t[..., 0].long().clamp(0, nc - 1), box_convert(xyxy, "xyxy", "cxcywh")


def _gather(x: Tensor, index: Tensor) -> Tensor:
    """x (B, M, ...) at index (B, Q) (clamped at 0) -> (B, Q, ...)."""
    idx = index.clamp(min=0)
    if x.dim() == 2:
        return x.gather(1, idx)
    return x.gather(1, idx.unsqueeze(-1).expand(*idx.shape, x.shape[-1]))


# ----------------------------------------------------------------------------- the criterion
class SetAssignment(NamedTuple):
    """Which target row each query of each supervised output set was trained towards, as
    :meth:`DetrLoss.terms` decided it (what a task head's extra terms, e.g. masks, reuse).

    ``sets``: (output dict, (B, Q) long target row or -1) of every Hungarian-matched set (the
    final layer first, then ``aux_outputs``, ``pre_outputs``, ``enc_outputs``), each with its
    own one-to-one assignment (not D-FINE's union), normalised by ``num_boxes``. ``dn_sets``: the
    denoising layers (``dn_outputs``) with their assignment by construction (-1 on negatives and
    padded slots), normalised by ``num_dn`` (None without denoising); ``dn_limit`` bounds the
    positives per image (``groups * slots``; 0 without denoising).
    """
    sets: list[tuple[dict, Tensor]]
    num_boxes: Tensor
    dn_sets: list[tuple[dict, Tensor]]
    num_dn: Tensor | None
    dn_limit: int


class DetrLoss(nn.Module):
    """The DETR set criterion; ``forward(outputs, targets, mask) -> (loss, items)``.

    ``outputs``: the training dict of a DETR decoder plus ``input_size`` (h, w) of the network
    input (:meth:`DetrModel.train_forward` adds it); ``targets`` (B, M, 5) ``[cls, x1, y1, x2,
    y2]`` in input pixels, ``mask`` (B, M) bool real rows. ``items`` (detached) are the weighted
    sums over every supervised set, in the order of :attr:`item_names`; ``loss`` is their sum.
    ``fine=True`` selects the D-FINE recipe (union matching for the box terms, FGL, DDF).
    ``cls_loss`` picks the class term: ``"vfl"`` (RT-DETR, D-FINE; ``alpha``, ``gamma``) or
    ``"mal"`` (DEIM; ``gamma``, optional ``mal_alpha``); it also names the first item.
    """

    def __init__(self, num_classes: int, *, fine: bool = False, alpha: float = 0.75, gamma: float = 2.0,
                 weight_vfl: float = 1.0, weight_bbox: float = 5.0, weight_giou: float = 2.0,
                 weight_fgl: float = 0.15, weight_ddf: float = 1.5, ddf_temperature: float = 5.0,
                 matcher: HungarianMatcher | None = None, cls_loss: str = "vfl", weight_mal: float = 1.0,
                 mal_alpha: float | None = None):
        super().__init__()
        if cls_loss not in ("vfl", "mal"):
            raise ValueError(f"unknown cls_loss {cls_loss!r} (expected 'vfl' or 'mal')")
        self.num_classes, self.fine = int(num_classes), bool(fine)
        self.alpha, self.gamma = alpha, gamma
        self.cls_loss, self.mal_alpha = cls_loss, mal_alpha
        self.weights = {"vfl": weight_vfl, "mal": weight_mal, "bbox": weight_bbox, "giou": weight_giou,
                        "fgl": weight_fgl, "ddf": weight_ddf}
        self.ddf_temperature = ddf_temperature
        self.matcher = matcher or HungarianMatcher()
        self.item_names: tuple[str, ...] = (cls_loss, "bbox", "giou") + (("fgl", "ddf") if self.fine else ())

    def forward(self, outputs: dict[str, Any], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        dev = outputs["pred_logits"].device
        with torch.autocast(device_type=dev.type, enabled=False):
            return self._compute(outputs, targets, mask.bool())

    # -- helpers
    def _class_box(self, out: dict, match: Tensor, labels: Tensor, gt: Tensor, *, box_match: Tensor | None = None,
                   valid: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(class, l1, giou) sums of one output set; ``box_match`` (default ``match``) for the box terms."""
        logits, boxes = out["pred_logits"].float(), out["pred_boxes"].float()
        pos = match >= 0
        tgt = _gather(gt, match)
        iou = bbox_iou(box_convert(boxes.detach(), "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy"))
        iou = torch.where(pos, iou, torch.zeros_like(iou))
        if self.cls_loss == "mal":
            cls = matchability_aware_loss(logits, _gather(labels, match), iou, pos, gamma=self.gamma,
                                          alpha=self.mal_alpha, valid=valid)
        else:
            cls = varifocal_loss(logits, _gather(labels, match), iou, pos, alpha=self.alpha, gamma=self.gamma,
                                 valid=valid)
        bm = match if box_match is None else box_match
        l1, giou = box_losses(boxes, _gather(gt, bm), bm >= 0)
        return cls, l1, giou

    def _compute(self, outputs: dict[str, Any], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        tot, _ = self.terms(outputs, targets, mask)
        items = torch.stack([tot[k] for k in self.item_names])
        return items.sum(), items.detach()

    def terms(self, outputs: dict[str, Any], targets: Tensor, mask: Tensor
              ) -> tuple[dict[str, Tensor], SetAssignment]:
        """The weighted item sums by name (not detached) and the assignment behind them
        (:class:`SetAssignment`). Call with autocast off, ``mask`` bool (as :meth:`forward` does)."""
        labels, gt = normalized_targets(targets, outputs["input_size"], self.num_classes)
        # padded rows may hold anything: give them a harmless box so no NaN / inf enters a masked term
        gt = torch.where(mask.unsqueeze(-1), gt, torch.full_like(gt, 0.5))
        labels = torch.where(mask, labels, torch.zeros_like(labels))
        num_boxes = mask.sum().float().clamp(min=1)
        aux = list(outputs.get("aux_outputs", []))
        sets = [outputs] + aux
        if self.fine and "pre_outputs" in outputs:
            sets.append(outputs["pre_outputs"])
        if "enc_outputs" in outputs:
            sets.append(outputs["enc_outputs"])
        pairs = [(o["pred_logits"].detach(), o["pred_boxes"].detach()) for o in sets]
        match, union = self.matcher(pairs, labels, gt, mask,
                                    union_of=range(len(sets)) if self.fine else None)
        zero = gt.new_zeros(())
        tot = {k: zero for k in self.item_names}

        def add(name: str, value: Tensor, norm: Tensor) -> None:
            tot[name] = tot[name] + self.weights[name] * value / norm

        def add3(terms: tuple[Tensor, Tensor, Tensor], cls_norm: Tensor, box_norm: Tensor) -> None:
            add(self.cls_loss, terms[0], cls_norm)
            add("bbox", terms[1], box_norm)
            add("giou", terms[2], box_norm)

        if not self.fine:
            for k, o in enumerate(sets):
                add3(self._class_box(o, match[k], labels, gt), num_boxes, num_boxes)
        else:
            num_go = (union >= 0).sum().float().clamp(min=1)
            for k, o in enumerate(sets):
                add3(self._class_box(o, match[k], labels, gt, box_match=union), num_boxes, num_go)
            # the D-FINE DDF balance: sqrt of the matched / unmatched element counts, batch 32
            pos4 = (union >= 0).sum().float() * 4
            scale = 32.0 / union.shape[0]
            num_pos = (pos4 * scale).sqrt()
            num_neg = ((union.numel() * 4 - pos4) * scale).sqrt()
            self._fine_terms(outputs, aux + [outputs], union, gt, num_go, num_pos, num_neg, add)

        assignment = SetAssignment([(o, match[k]) for k, o in enumerate(sets)], num_boxes, [], None, 0)
        if "dn_outputs" in outputs:
            meta = outputs["dn_meta"]
            dn_match, dn_valid = meta["dn_match"], meta["dn_valid"]
            num_dn = num_boxes * meta["dn_num_group"]
            dn_sets = list(outputs["dn_outputs"])
            extra = [outputs["dn_pre_outputs"]] if self.fine and "dn_pre_outputs" in outputs else []
            for o in dn_sets + extra:
                add3(self._class_box(o, dn_match, labels, gt, valid=dn_valid), num_dn, num_dn)
            if self.fine:
                self._fine_terms(outputs, dn_sets, dn_match, gt, num_dn, num_pos, num_neg, add, valid=dn_valid)
            assignment = assignment._replace(dn_sets=[(o, dn_match) for o in dn_sets], num_dn=num_dn,
                                             dn_limit=int(meta["dn_num_group"]) * int(meta["dn_slots"]))
        return tot, assignment

    def _fine_terms(self, outputs: dict, layers: list[dict], match: Tensor, gt: Tensor, norm: Tensor,
                    num_pos: Tensor, num_neg: Tensor, add, valid: Tensor | None = None) -> None:
        """FGL on every layer with edge distributions, DDF on all but the last (the teacher)."""
        layers = [o for o in layers if "pred_corners" in o]
        if not layers:
            return
        up, reg_scale = outputs["up"].detach().float(), outputs["reg_scale"].detach().float()
        reg_max = layers[-1]["pred_corners"].shape[-1] // 4 - 1
        project = weighting_function(reg_max, up, reg_scale)
        pos = match >= 0
        valid = torch.ones_like(pos) if valid is None else valid
        tgt_xyxy = box_convert(_gather(gt, match), "cxcywh", "xyxy")
        teacher = layers[-1]
        for i, o in enumerate(layers):
            boxes = o["pred_boxes"].detach().float()
            iou = bbox_iou(box_convert(boxes, "cxcywh", "xyxy"), tgt_xyxy) * pos.float()
            corners = o["pred_corners"].float()
            add("fgl", fine_grained_localization_loss(corners, o["ref_points"].float(), tgt_xyxy, iou, pos,
                                                      project, reg_scale), norm)
            if i < len(layers) - 1:
                add("ddf", decoupled_distillation_loss(corners, teacher["pred_corners"].float(),
                                                       teacher["pred_logits"].float(), iou, pos, valid,
                                                       num_pos, num_neg, self.ddf_temperature), 1.0)


class DeimLoss(DetrLoss):
    """DEIM's criterion: the D-FINE recipe (union matching for the box terms, FGL, DDF) with MAL as
    the class term; items ``("mal", "bbox", "giou", "fgl", "ddf")``.

    Defaults are DEIM's D-FINE-based COCO configs (``deim.yml`` over ``dfine_hgnetv2.yml``):
    weights mal 1, bbox 5, giou 2, fgl 0.15, ddf 1.5; MAL gamma 1.5, no MAL alpha; the
    Hungarian matcher unchanged (class 2, bbox 5, giou 2; focal alpha 0.25, gamma 2).
    DEIM's other half, Dense O2O, is on the data side (mosaic stitching, so each image holds
    more targets and one-to-one matching yields more positives); this criterion does not change
    the matching.
    """

    def __init__(self, num_classes: int, *, gamma: float = 1.5, mal_alpha: float | None = None,
                 weight_mal: float = 1.0, weight_bbox: float = 5.0, weight_giou: float = 2.0,
                 weight_fgl: float = 0.15, weight_ddf: float = 1.5, ddf_temperature: float = 5.0,
                 matcher: HungarianMatcher | None = None):
        super().__init__(num_classes, fine=True, gamma=gamma, cls_loss="mal", mal_alpha=mal_alpha,
                         weight_mal=weight_mal, weight_bbox=weight_bbox, weight_giou=weight_giou,
                         weight_fgl=weight_fgl, weight_ddf=weight_ddf, ddf_temperature=ddf_temperature,
                         matcher=matcher)
