"""PIDNet's training loss (the original's ``FullModel`` with ``OhemCrossEntropy`` and
``BondaryLoss``, XuJiacong/PIDNet ``utils/``), fixed-shape and without host synchronisation.

The three training outputs (P-branch logits, main logits, boundary logit; each at 1/8) are
upsampled bilinearly to the masks' size with ``align_corners=True`` (the original's
``MODEL.ALIGN_CORNERS``), then::

    loss = 0.4 * CE(P) + OHEM(main) + 20 * weighted_BCE(boundary, edges) + OHEM(main | boundary)

* CE: cross-entropy averaged over the pixels that are not :data:`IGNORE`.
* OHEM (online hard example mining, threshold 0.9, at least 131072 kept): the pixels whose
  predicted probability of their true class is below ``max(0.9, the min_kept-th smallest such
  probability)``, averaged. Computed by sorting every pixel's probability (ignored pixels sorted
  last) and reading the threshold at a device index: the same pixels as the original's boolean
  selection, with fixed shapes.
* weighted BCE: binary cross-entropy of the boundary logit against the edge map, each edge pixel
  weighted by the share of non-edge pixels and each non-edge pixel by the share of edge pixels,
  averaged over every pixel.
* OHEM(main | boundary): the main logits' OHEM on the pixels whose boundary probability is above
  0.8 (the others ignored): the boundary-aware term.

Edges: the original runs ``cv2.Canny`` on each full-resolution label map (thresholds 0.1 / 0.2:
any change of label is an edge, one pixel wide), drops those within 6 pixels of the image border,
dilates them with a 4x4 kernel and then scales / crops them with the image. Here they come from
the training batch's masks on the device: a pixel is an edge where its right or lower neighbour
has another class (both pixels counted, not :data:`IGNORE`, so the padding of a crop or letterbox
makes no edge), dilated with the same 4x4 kernel (OpenCV's anchor: two pixels before, one after).
Simplified: the edges are those of the augmented mask at the training size (the original's are
computed before its random scaling, so their width scales with the image), and the 6-pixel
border rule is not applied (it removes edges near the original frame's border, not a crop's).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...tasks.semantic.maps import IGNORE

#: the Cityscapes recipe's weights (``LOSS.BALANCE_WEIGHTS``, ``SB_WEIGHTS``) and constants
P_WEIGHT = 0.4
MAIN_WEIGHT = 1.0
SB_WEIGHT = 1.0
BD_COEFF = 20.0
OHEM_THRESH = 0.9
OHEM_KEEP = 131072
BD_THRESH = 0.8


def upsample(x: torch.Tensor, size) -> torch.Tensor:
    """PIDNet's logit upsampling (bilinear, ``align_corners=True``), in float32."""
    return F.interpolate(x.float(), size=tuple(size), mode="bilinear", align_corners=True)


def masked_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy averaged over the non-ignored pixels (0 when there are none)."""
    total = F.cross_entropy(logits, target, ignore_index=IGNORE, reduction="none").sum()
    return total / (target != IGNORE).sum().clamp_min(1)


def ohem_ce(logits: torch.Tensor, target: torch.Tensor, thresh: float = OHEM_THRESH,
            min_kept: int = OHEM_KEEP) -> torch.Tensor:
    """The original's ``_ohem_forward`` with fixed shapes (see the module docstring)."""
    valid = target != IGNORE
    losses = F.cross_entropy(logits, target.clamp_min(0), reduction="none")   # (B, H, W)
    prob = torch.softmax(logits, 1).gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1)
    prob = torch.where(valid, prob, torch.full_like(prob, 2.0))   # ignored pixels sort last
    ordered = prob.flatten().sort().values
    k = (valid.sum() - 1).clamp(0, min_kept)   # the original's min(min_kept, n - 1)
    threshold = ordered.gather(0, k.reshape(1)).clamp_min(thresh)
    keep = valid & (prob < threshold)
    return (losses * keep).sum() / keep.sum().clamp_min(1)


def boundary_targets(masks: torch.Tensor) -> torch.Tensor:
    """(B, H, W) int masks -> (B, H, W) float edge map (see the module docstring)."""
    valid = masks != IGNORE
    edge = torch.zeros_like(valid)
    right = (masks[:, :, 1:] != masks[:, :, :-1]) & valid[:, :, 1:] & valid[:, :, :-1]
    down = (masks[:, 1:, :] != masks[:, :-1, :]) & valid[:, 1:, :] & valid[:, :-1, :]
    edge[:, :, :-1] |= right
    edge[:, :-1, :] |= down
    e = F.pad(edge.float().unsqueeze(1), (2, 1, 2, 1))
    return F.max_pool2d(e, 4, stride=1).squeeze(1)


def weighted_bce(logit: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The original's ``weighted_bce``: class-balanced BCE averaged over every pixel."""
    pos = target.sum()
    neg = target.numel() - pos
    weight = torch.where(target > 0.5, neg, pos) / target.numel()
    return F.binary_cross_entropy_with_logits(logit, target, weight, reduction="mean")


class PIDNetLoss(nn.Module):
    """``loss((p_logits, logits, boundary), masks) -> (loss, items)``; ``items`` are the four
    weighted terms (P-branch CE, main OHEM, boundary BCE, boundary-aware OHEM), summing to ``loss``."""

    item_names = ("p_ce", "ohem", "bd", "sb")

    def forward(self, outputs, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(outputs, torch.Tensor) or len(outputs) != 3:
            raise ValueError("PIDNet's loss takes the training outputs (P logits, main logits, boundary logit) "
                             "of a network with its auxiliary heads: train through Model.train(), which adds "
                             "them, or call net.add_aux_heads() first")
        size = masks.shape[-2:]
        p, main, d = (upsample(o, size) for o in outputs)
        d = d[:, 0]
        edges = boundary_targets(masks)
        p_ce = P_WEIGHT * masked_ce(p, masks)
        ohem = MAIN_WEIGHT * ohem_ce(main, masks)
        bd = BD_COEFF * weighted_bce(d, edges)
        on_boundary = torch.where(torch.sigmoid(d) > BD_THRESH, masks, torch.full_like(masks, IGNORE))
        sb = SB_WEIGHT * ohem_ce(main, on_boundary)
        items = torch.stack([p_ce, ohem, bd, sb])
        return items.sum(), items.detach()
