"""Contrastive query denoising for DETR training (the RT-DETR / D-FINE recipe).

During training the decoder gets, besides its Q matching queries, noised copies of the ground
truth: ``groups`` groups, each with a positive half (box corners moved by less than half the
box size, so the query should reconstruct the box) and a negative half (moved by one to two
half-sizes, so the query should predict "no object"); half of the noised queries' labels are
replaced by random ones (``label_noise_ratio * 0.5`` of them). Their outputs are supervised
with the assignment known by construction (no Hungarian matching).

Layout. The real target rows of each image are first moved to the front (a stable sort of the
mask, so any padding pattern works), giving ``slots`` gt slots per image; group ``k`` occupies
queries ``[2 * slots * k, 2 * slots * (k + 1))``, positives first. ``slots`` is the batch's
largest gt count (the RT-DETR rule, so the decoder's token count varies between batches; this
reads one number from the device), or, with ``pad_to``, the targets' padded row count rounded
up to a multiple of ``pad_to``: then no value is read on the host and every shape is fixed for
a given targets shape (the trainer's collate already buckets the row count). ``groups =
max(1, num_denoising // slots)``.

Padded slots (an image with fewer gts than ``slots``) carry the embedding's padding class and
must not matter: the attention mask hides them from every other query (they only see
themselves and what an ordinary query of their group may see), and the loss skips them.

Attention mask (True = may not attend), per image, (B * heads, D + Q, D + Q): the matching
queries see no denoising query; a denoising group sees itself and the matching queries, never
another group; nobody but itself sees a padded slot.

The random draws are made on a (B, groups, 2, M) layout (M = the targets' row count) and then
cut or padded to ``slots``, so a real slot receives the same noise whatever ``slots`` is: with
the same group count, padded and unpadded denoising see identical queries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert

from .layers import inverse_sigmoid

__all__ = ["DenoisingQueries", "contrastive_denoising", "targets_from_list", "split_denoising_outputs"]

#: the keys of a decoder output dict whose second dimension runs over the queries
QUERY_KEYS = ("pred_logits", "pred_boxes", "pred_corners", "ref_points", "queries")


@dataclass
class DenoisingQueries:
    """What :func:`contrastive_denoising` hands the decoder.

    ``content`` (B, D, C) class embeddings, ``ref_unact`` (B, D, 4) box logits (inverse
    sigmoid of cxcywh), ``attn_mask`` (B * heads, D + Q, D + Q) bool (True = blocked), and
    ``meta`` with ``dn_num_split`` (D, Q), ``dn_num_group``, ``dn_slots``, ``dn_positive_idx``
    (B, groups * slots) long (query index of each positive, slot-major within a group),
    ``dn_match`` (B, D) long (the target row each valid positive reconstructs, -1 for
    negatives and padded slots), ``dn_valid`` (B, D) bool (not a padded slot).
    """

    content: Tensor
    ref_unact: Tensor
    attn_mask: Tensor
    meta: dict[str, Any]


def targets_from_list(targets: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The reference format (one dict per image with ``labels`` (n,) and normalised cxcywh
    ``boxes`` (n, 4)) -> the padded dict ``{"labels", "boxes", "mask"}`` used here."""
    counts = [int(t["labels"].shape[0]) for t in targets]
    m = max(counts + [1])
    dev = targets[0]["boxes"].device
    labels = torch.zeros(len(targets), m, dtype=torch.long, device=dev)
    boxes = torch.zeros(len(targets), m, 4, device=dev)
    mask = torch.zeros(len(targets), m, dtype=torch.bool, device=dev)
    for i, (t, n) in enumerate(zip(targets, counts)):
        labels[i, :n], boxes[i, :n], mask[i, :n] = t["labels"], t["boxes"], True
    return {"labels": labels, "boxes": boxes, "mask": mask}


def _fit(x: Tensor, slots: int, dim: int, value: float = 0) -> Tensor:
    """Cut or pad (with ``value``) dimension ``dim`` of ``x`` to ``slots`` entries."""
    n = x.shape[dim]
    if n >= slots:
        return x.narrow(dim, 0, slots)
    pad_shape = list(x.shape)
    pad_shape[dim] = slots - n
    return torch.cat([x, x.new_full(pad_shape, value)], dim)


def contrastive_denoising(targets: dict[str, Any], num_classes: int, num_queries: int,
                          class_embed: nn.Module, heads: int, *, num_denoising: int = 100,
                          label_noise_ratio: float = 0.5, box_noise_scale: float = 1.0,
                          pad_to: int | None = None) -> DenoisingQueries | None:
    """Build the denoising queries for a batch (see the module docstring).

    ``targets``: ``labels`` (B, M) long, ``boxes`` (B, M, 4) normalised cxcywh, ``mask``
    (B, M) bool; an optional ``pad_to`` entry overrides the argument. Returns None when
    denoising is off (``num_denoising <= 0``) or, without ``pad_to``, when the batch has no
    ground truth (the RT-DETR rule).
    """
    if isinstance(targets, (list, tuple)):
        targets = targets_from_list(list(targets))
    if targets.get("pad_to") is not None:
        pad_to = targets["pad_to"]
    if num_denoising <= 0:
        return None
    mask = targets["mask"].bool()
    b, m = mask.shape
    dev = mask.device
    # real rows first (stable), so slot j of image i is its j-th real target
    order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices
    valid_m = mask.gather(1, order)
    labels_m = targets["labels"].long().gather(1, order).clamp(0, num_classes - 1)
    boxes_m = targets["boxes"].float().gather(1, order.unsqueeze(-1).expand(b, m, 4))
    if pad_to:
        slots = max(1, -(-m // int(pad_to)) * int(pad_to))
    else:
        slots = int(mask.sum(1).max()) if b and m else 0
        if slots == 0:
            return None
    groups = max(1, num_denoising // slots)

    # random draws on the (B, groups, 2, M) layout, then cut / padded to the slots
    flip = torch.rand(b, groups, 2, m, device=dev) < label_noise_ratio * 0.5
    new_label = torch.randint(0, num_classes, (b, groups, 2, m), device=dev)
    sign = torch.randint(0, 2, (b, groups, 2, m, 4), device=dev).float() * 2.0 - 1.0
    part = torch.rand(b, groups, 2, m, 4, device=dev)
    flip, new_label = _fit(flip, slots, 3, False), _fit(new_label, slots, 3)
    sign, part = _fit(sign, slots, 3), _fit(part, slots, 3)

    valid = _fit(valid_m, slots, 1, False)                                      # (B, S)
    labels = _fit(labels_m, slots, 1)
    boxes = torch.where(valid.unsqueeze(-1), _fit(boxes_m, slots, 1), 0.0)                 # padded slots: 0
    rows = _fit(order, slots, 1)                                                # target row of each slot
    d = 2 * slots * groups
    valid_q = valid[:, None, None, :].expand(b, groups, 2, slots)
    cls = labels[:, None, None, :].expand(b, groups, 2, slots)
    cls = torch.where(flip & valid_q, new_label, cls)
    cls = torch.where(valid_q, cls, torch.full_like(cls, num_classes))          # padding class
    known = boxes[:, None, None, :, :].expand(b, groups, 2, slots, 4)
    if box_noise_scale > 0:
        xyxy = box_convert(known, "cxcywh", "xyxy")
        half = torch.cat([known[..., 2:], known[..., 2:]], -1) * 0.5 * box_noise_scale
        negative = torch.arange(2, device=dev).to(xyxy.dtype).view(1, 1, 2, 1, 1)   # +1 on negatives
        xyxy = (xyxy + sign * (part + negative) * half).clamp(0.0, 1.0)
        known = box_convert(xyxy, "xyxy", "cxcywh")
    ref_unact = inverse_sigmoid(known).reshape(b, d, 4)
    content = class_embed(cls.reshape(b, d))

    # supervision known by construction: positive (valid) queries reconstruct their target row
    is_pos = (torch.arange(2, device=dev) == 0).view(1, 1, 2, 1).expand(b, groups, 2, slots)
    match = torch.where(is_pos & valid_q, rows[:, None, None, :].expand(b, groups, 2, slots),
                        torch.full_like(cls, -1)).reshape(b, d)
    dn_valid = valid_q.reshape(b, d)
    pos_idx = (torch.arange(groups, device=dev).view(groups, 1) * 2 * slots
               + torch.arange(slots, device=dev).view(1, slots)).reshape(1, -1).expand(b, -1)

    # attention mask: (D + Q) x (D + Q), then per image the padded columns
    total = d + num_queries
    group_of = torch.cat([torch.arange(d, device=dev) // (2 * slots),
                          torch.full((num_queries,), -1, device=dev)])
    q_is_dn = group_of >= 0
    blocked = q_is_dn.view(1, total) & (group_of.view(total, 1) != group_of.view(1, total))
    padded_col = torch.cat([~dn_valid, torch.zeros(b, num_queries, dtype=torch.bool, device=dev)], 1)
    eye = torch.eye(total, dtype=torch.bool, device=dev)
    attn = blocked.unsqueeze(0) | (padded_col.unsqueeze(1) & ~eye.unsqueeze(0))  # (B, T, T)
    attn = attn.unsqueeze(1).expand(b, heads, total, total).reshape(b * heads, total, total)

    meta = {"dn_num_split": (d, num_queries), "dn_num_group": groups, "dn_slots": slots,
            "dn_positive_idx": pos_idx, "dn_match": match, "dn_valid": dn_valid}
    return DenoisingQueries(content, ref_unact, attn, meta)


def split_denoising_outputs(out: dict[str, Any], dn: DenoisingQueries | None) -> dict[str, Any]:
    """Split a training output dict whose query dimension holds [denoising | matching] queries.

    The matching part stays where it was (``pred_*``, ``aux_outputs``, ``pre_outputs``; the
    encoder's ``enc_outputs`` never had denoising queries); the denoising part goes to
    ``dn_outputs`` (one dict per decoder layer, the last layer last), ``dn_pre_outputs`` (when
    ``pre_outputs`` exists) and ``dn_meta``. Keys of :data:`QUERY_KEYS` are split, others kept.
    """
    if dn is None:
        return out
    d = dn.meta["dn_num_split"][0]

    def cut(o: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        dn_part, rest = {}, dict(o)
        for k in QUERY_KEYS:
            if k in o and isinstance(o[k], Tensor):
                dn_part[k], rest[k] = o[k][:, :d], o[k][:, d:]
        return dn_part, rest

    dn_last, main = cut(out)
    dn_layers = []
    aux = []
    for o in out.get("aux_outputs", []):
        a, r = cut(o)
        dn_layers.append(a)
        aux.append(r)
    main["aux_outputs"] = aux
    main["dn_outputs"] = dn_layers + [dn_last]
    if "pre_outputs" in out:
        main["dn_pre_outputs"], main["pre_outputs"] = cut(out["pre_outputs"])
    main["dn_meta"] = dn.meta
    return main
