"""Panoptic quality (PQ = SQ x RQ) through torchmetrics' ``PanopticQuality`` (panopticapi's
definition: segments matched at IoU > 0.5, void pixels left out)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..base import Evaluator
from .merge import merge, query_scores


def target_pairs(classes: torch.Tensor, valid: torch.Tensor, masks: torch.Tensor, void: int) -> torch.Tensor:
    """The collate's (B, M) classes, row mask and (B, M, h, w) covered fractions -> (B, h, w, 2)
    (category, instance) per cell: the segment covering most of the cell when it covers more than
    half of it, else void (category ``void``, which the metric leaves out)."""
    frac = masks.float() * valid[:, :, None, None]
    if frac.shape[1] == 0:
        b, _, h, w = frac.shape
        return torch.stack((torch.full((b, h, w), void), torch.zeros(b, h, w, dtype=torch.long)), -1)
    best, idx = frac.max(1)
    cat = classes.gather(1, idx.flatten(1)).view_as(idx)
    covered = best > 0.5
    return torch.stack((torch.where(covered, cat, torch.full_like(cat, void)),
                        torch.where(covered, idx + 1, torch.zeros_like(idx))), -1)


def panoptic_quality(things: Sequence[int], stuff: Sequence[int]):
    """torchmetrics' metric returning PQ, SQ, RQ per class (things first, then stuff)."""
    try:
        from torchmetrics.detection import PanopticQuality
    except ImportError as e:
        raise ModuleNotFoundError("panoptic validation computes PQ with torchmetrics, which is not installed: "
                                  "pip install 'libreyolo-graphs[panoptic]' (or pip install torchmetrics)") from e
    return PanopticQuality(things=set(things), stuffs=set(stuff), allow_unknown_preds_category=True,
                           return_sq_and_rq=True, return_per_class=True)


class PanopticEvaluator(Evaluator):
    """PQ / SQ / RQ of a validation split on the stride-4 grid of the canvas: the network's queries
    merged on the device (:func:`.merge.merge`, the validation thresholds), against the segments
    of the loader's batch. ``pq`` averages the classes present in the split (truth or prediction),
    as panopticapi does; ``pq_things`` / ``pq_stuff`` over each kind."""

    def __init__(self, model, options, things: Sequence[int]):
        self.nc = int(model.nc)
        self.names = dict(model.names)
        self.things = sorted(set(int(t) for t in things))
        self.stuff = [c for c in range(self.nc) if c not in set(self.things)]
        self.conf, self.mask_thresh, self.overlap = (float(options.val_conf), float(options.val_mask_threshold),
                                                     float(options.val_overlap))
        self.stage_tag = ("panoptic", self.conf, self.mask_thresh, self.overlap)
        self._stuff_mask: dict[str, torch.Tensor] = {}
        self.reset()

    def reset(self) -> None:
        self.metric = panoptic_quality(self.things, self.stuff)
        self.seen: set[int] = set()

    def stuff_mask(self, device: torch.device) -> torch.Tensor:
        key = str(device)
        if key not in self._stuff_mask:
            m = torch.zeros(self.nc, dtype=torch.bool)
            m[self.stuff] = True
            self._stuff_mask[key] = m.to(device)
        return self._stuff_mask[key]

    def finish(self, outputs):
        """(class logits (B, Q, nc + 1), stride-4 mask logits (B, Q, h, w)) -> (B, h, w, 2)
        (category, segment id) per cell; fixed shapes."""
        class_logits, mask_logits = outputs
        stuff = self.stuff_mask(class_logits.device)
        score, label, kept = query_scores(class_logits, self.conf)
        hw = tuple(mask_logits.shape[-2:])
        out = []
        for i in range(class_logits.shape[0]):
            m = merge(score[i], label[i], kept[i], lambda s, e, i=i: mask_logits[i, s:e].float().sigmoid(), hw, stuff,
                      mask_thresh=self.mask_thresh, overlap=self.overlap)
            out.append(torch.stack((m.category, m.ids.long()), -1))
        return torch.stack(out)

    def process(self, outputs: torch.Tensor, batch: Sequence[torch.Tensor]) -> None:
        _, classes, valid, masks = batch
        target = target_pairs(classes, valid, masks, self.nc)
        preds = outputs.cpu()
        for t in (preds, target):
            cats = t[..., 0].unique()
            self.seen.update(int(c) for c in cats if int(c) < self.nc)
        self.metric.update(preds, target)

    def evaluate(self) -> dict[str, Any]:
        order = self.things + self.stuff
        # (C, 3) PQ, SQ, RQ per class in ``order`` (its docstring says (3, C); the tensor is (C, 3))
        per = self.metric.compute().double().reshape(len(order), 3).T
        present = torch.tensor([c in self.seen for c in order], dtype=torch.bool)
        thing = torch.tensor([c in set(self.things) for c in order], dtype=torch.bool)

        def mean(row: int, sel: torch.Tensor) -> float:
            return float(per[row][sel].mean()) if bool(sel.any()) else float("nan")

        out: dict[str, Any] = {"pq": mean(0, present), "sq": mean(1, present), "rq": mean(2, present),
                               "pq_things": mean(0, present & thing), "pq_stuff": mean(0, present & ~thing)}
        out["per_class"] = {self.names.get(c, str(c)): float(per[0][k]) for k, c in enumerate(order)
                            if bool(present[k])}
        return out
