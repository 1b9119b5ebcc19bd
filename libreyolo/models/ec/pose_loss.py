"""The set criterion of the EC pose variant (after DETRPose).

Each decoder layer's queries (and the first layer's initial keypoints and the selected encoder
proposals) are matched one-to-one to the ground-truth instances by the Hungarian algorithm on

    2 * focal class cost + 10 * L1(keypoints) + 4 * (1 - OKS)

where the L1 term averages the labelled keypoints' normalized coordinates and OKS is COCO's
object keypoint similarity (scale: the instance's box area, per-keypoint sigmas of the dataset).
Each matched set is then trained with

* a varifocal class loss (weight 2) whose target for a matched query is its OKS (detached),
* an L1 loss on the labelled keypoints (weight 10),
* an OKS loss ``1 - OKS`` (weight 4),

each normalized by the number of instances. Targets arrive padded to a bucketed row count with a
mask (:func:`libreyolo.tasks.pose.data.collate_pose`); padded rows never enter a cost or a loss.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..detr_common.matcher import hungarian_assign

W_CLASS, W_KPT, W_OKS = 2.0, 10.0, 4.0


def pairwise_oks(pred: Tensor, gt: Tensor, area: Tensor, sigmas: Tensor) -> Tensor:
    """OKS of every predicted pose with every ground truth: pred (B, Q, K, 2), gt (B, M, K, 3)
    (x, y, visibility), area (B, M), all normalized -> (B, Q, M)."""
    d2 = ((pred[:, :, None] - gt[:, None, :, :, :2]) ** 2).sum(-1)                 # (B, Q, M, K)
    kappa2 = (2 * sigmas) ** 2
    e = d2 / (2 * area[:, None, :, None].clamp(min=1e-6) * kappa2)
    vis = (gt[..., 2] > 0).float()[:, None]                                       # (B, 1, M, K)
    return (torch.exp(-e) * vis).sum(-1) / vis.sum(-1).clamp(min=1.0)


class PoseSetLoss(nn.Module):
    """``loss(outputs, cls, boxes, kpts, mask) -> (loss, items)``; ``outputs`` is the network's
    training dict, targets as the pose collate gives them (normalized)."""

    item_names = ("cls_loss", "kpt_loss", "oks_loss")

    def __init__(self, nc: int, sigmas: Sequence[float], alpha: float = 0.75, gamma: float = 2.0):
        super().__init__()
        self.nc = nc
        self.register_buffer("sigmas", torch.tensor(list(sigmas), dtype=torch.float32), persistent=False)
        self.alpha, self.gamma = alpha, gamma

    def _costs(self, out: dict, cls: Tensor, gt: Tensor, area: Tensor) -> Tensor:
        logits = out["pred_logits"][..., 1:].float()
        b, q, _ = logits.shape
        k = gt.shape[2]
        pred = out["pred_keypoints"].float().reshape(b, q, k, 2)
        p = logits.sigmoid().gather(2, cls[:, None, :].expand(-1, q, -1))             # (B, Q, M)
        a, g = 0.25, 2.0
        c_cls = a * (1 - p) ** g * -(p + 1e-8).log() - (1 - a) * p ** g * -(1 - p + 1e-8).log()
        vis = (gt[..., 2] > 0).float()[:, None]                                      # (B, 1, M, K)
        l1 = ((pred[:, :, None] - gt[:, None, :, :, :2]).abs().sum(-1) * vis).sum(-1) / vis.sum(-1).clamp(min=1)
        oks = pairwise_oks(pred, gt, area, self.sigmas.to(pred.device))
        return W_CLASS * c_cls + W_KPT * l1 + W_OKS * (1 - oks)

    def _set_loss(self, out: dict, assign: Tensor, cls: Tensor, gt: Tensor, area: Tensor, n: Tensor) -> Tensor:
        logits = out["pred_logits"][..., 1:].float()
        b, q, nc = logits.shape
        k = gt.shape[2]
        pred = out["pred_keypoints"].float().reshape(b, q, k, 2)
        matched = assign >= 0                                                          # (B, Q)
        idx = assign.clamp(min=0)
        tgt = gt.gather(1, idx[:, :, None, None].expand(-1, -1, k, 3))                # (B, Q, K, 3)
        t_area = area.gather(1, idx)
        t_cls = cls.gather(1, idx)
        vis = (tgt[..., 2] > 0).float() * matched[..., None].float()
        l1 = ((pred - tgt[..., :2]).abs().sum(-1) * vis).sum() / n
        d2 = ((pred - tgt[..., :2]) ** 2).sum(-1)
        e = d2 / (2 * t_area[..., None].clamp(min=1e-6) * (2 * self.sigmas.to(pred.device)) ** 2)
        oks = (torch.exp(-e) * vis).sum(-1) / vis.sum(-1).clamp(min=1)                 # (B, Q)
        oks_loss = ((1 - oks) * matched.float()).sum() / n
        score = torch.zeros_like(logits)
        score.scatter_(2, t_cls[..., None], (oks.detach() * matched.float())[..., None])
        p = logits.sigmoid()
        weight = self.alpha * p.detach() ** self.gamma * (1 - (score > 0).float()) + score
        cls_loss = (F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="none")
                    .sum() / n)
        return torch.stack([W_CLASS * cls_loss, W_KPT * l1, W_OKS * oks_loss])

    def forward(self, outputs: dict, cls: Tensor, boxes: Tensor, kpts: Tensor, mask: Tensor):
        cls = cls.long() * mask.long()
        gt = kpts.float() * mask[..., None, None].float()
        area = (boxes[..., 2] * boxes[..., 3]).float() * mask.float()
        n = mask.sum().clamp(min=1).float()
        sets = [outputs, *outputs.get("aux_outputs", [])]
        for key in ("pre_outputs", "enc_outputs"):
            if key in outputs:
                sets.append(outputs[key])
        costs = torch.stack([self._costs(o, cls, gt, area) for o in sets])
        assign, _ = hungarian_assign(costs, mask)
        total = sum(self._set_loss(o, assign[i], cls, gt, area, n) for i, o in enumerate(sets))
        return total.sum(), total.detach()
