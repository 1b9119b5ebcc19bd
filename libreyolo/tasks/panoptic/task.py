"""Panoptic segmentation: every pixel gets a class, and the pixels of countable things an instance.

Predict stage (on the device, captured with the network where the family allows):
``model.infer`` gives per-query class logits (B, Q, nc + 1) and stride-4 mask logits (B, Q, h, w);
the stage adds each query's score, class and whether it is kept (fixed shapes). After the stage,
on the same device, per image: the kept queries' mask logits are sampled at the image's pixels
(the letterbox inverted, bilinear as an upsampling of the logits, as the segment task does) and
merged into one segment map (:mod:`.merge`: score-weighted winner per pixel, the mask threshold,
the overlap test, one segment per stuff class); the map and its segments reach the host as
``Results.panoptic`` (:class:`~.results.PanopticSegmentation`).

Which classes are things: the model's ``thing_class_ids`` metadata (a checkpoint field, set from
the dataset when training), else COCO panoptic's 80 things for a 133-class model, else every class
(a warning says so: stuff is then never fused).

Training: the built-in ``shapes-panoptic`` set or a panoptic dataset (:mod:`.data`); the family
brings its loss (EoMT: Mask2Former's set criterion). Validation: PQ, SQ, RQ through torchmetrics
(:mod:`.metrics`) on the stride-4 grid of the canvas; ``pq`` picks ``best.pt``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ...options import Fraction, Int, check_fields, option
from ..base import PredictPlan, Task, TaskOptions
from .merge import CHUNK, merge, query_scores

log = logging.getLogger(__name__)

#: COCO panoptic's label set: 80 things, then 53 stuff classes
COCO_PANOPTIC_NC, COCO_PANOPTIC_THINGS = 133, 80


def thing_ids(model) -> list[int]:
    """The classes of ``model`` that are things (see the module docstring)."""
    ids = (getattr(model, "meta", None) or {}).get("thing_class_ids")
    if isinstance(ids, str):   # an ONNX export's metadata holds it as JSON
        import json
        ids = json.loads(ids)
    if ids is not None:
        return sorted({int(i) for i in ids})
    if model.nc == COCO_PANOPTIC_NC:
        return list(range(COCO_PANOPTIC_THINGS))
    if not getattr(model, "_warned_things", False):
        model._warned_things = True
        log.warning("this %d-class panoptic model has no 'thing_class_ids' metadata: every class is treated as a "
                    "thing, so stuff regions are not fused into one segment per class (set model.meta"
                    "['thing_class_ids'], or train on a dataset whose YAML lists its 'things')", model.nc)
    return list(range(model.nc))


@dataclass
class PanopticOptions(TaskOptions):
    """Panoptic training options: flip augmentation, segment padding, validation thresholds."""

    fliplr: float = option(0.5, "probability of a horizontal flip", Fraction())
    bucket: int = option(16, "segments padded to this times a power of two", Int(1))
    val_conf: float = option(0.8, "query score a segment needs in validation", Fraction())
    val_mask_threshold: float = option(0.5, "mask probability of a segment's pixels in validation", Fraction())
    val_overlap: float = option(0.8, "share of its own mask a query must win in validation", Fraction())

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_fields(self)


class PanopticPlan(PredictPlan):
    """One panoptic predict call (see the module docstring)."""

    def __init__(self, model, *, threshold: float, mask_threshold: float, overlap_threshold: float):
        self.model = model
        self.conf, self.mask_thresh, self.overlap = float(threshold), float(mask_threshold), float(overlap_threshold)
        self.tag = ("panoptic", self.conf)
        self.things = thing_ids(model)

    def finish(self, outputs, *extra):
        """-> class logits' score, label and kept flag per query, and the mask logits."""
        class_logits, mask_logits = outputs
        score, label, kept = query_scores(class_logits, self.conf)
        return score, label, kept, mask_logits

    def results(self, out, chunk, size, speed):
        from ...ops.letterbox import inverse_params
        from ...results import Results
        from ..segment.task import sample_masks
        from .results import PanopticSegmentation
        score, label, kept, mask_logits = out
        m = self.model
        stuff = torch.ones(m.nc, dtype=torch.bool)
        stuff[self.things] = False
        stuff = stuff.to(score.device)
        results = []
        for i, it in enumerate(chunk):
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            idx = kept[i].nonzero().squeeze(1)                    # the kept queries only: their count is known here
            sx, sy, px, py = inverse_params(h, w, size, m.preprocess.resize)
            logits = mask_logits[i][idx].float()

            def probs(s, e, logits=logits, h=h, w=w, sx=sx, sy=sy, px=px, py=py):
                return sample_masks(logits[s:e], size, h, w, sx, sy, px, py).sigmoid()

            merged = merge(score[i][idx], label[i][idx], torch.ones_like(idx, dtype=torch.bool), probs, (h, w), stuff,
                           mask_thresh=self.mask_thresh, overlap=self.overlap, chunk=CHUNK)
            starts = merged.start.nonzero().squeeze(1).cpu().tolist()
            seg, lab, sc, area = (t.cpu() for t in (merged.segment, label[i][idx], score[i][idx], merged.area))
            things = set(self.things)
            segments = [{"id": int(seg[k]), "class": int(lab[k]), "isthing": int(lab[k]) in things,
                         "score": float(sc[k]), "area": int(area[k])} for k in starts]
            results.append(Results(it.image, it.name, m.names, None, speed=dict(speed),
                                   panoptic=PanopticSegmentation(merged.ids.cpu(), segments)))
        return results


class PanopticTask(Task):
    name = "panoptic"
    primary_metric = "pq"
    Options = PanopticOptions
    predict_defaults = {"threshold": 0.8, "mask_threshold": 0.5, "overlap_threshold": 0.8}

    def plan(self, model, size, constants, **opts) -> PanopticPlan:
        from ...options import check_fraction
        from ..semantic.maps import check_resize
        check_resize(model.preprocess.resize)
        o = {**self.predict_defaults, **opts}
        return PanopticPlan(model, threshold=check_fraction("threshold", o["threshold"]),
                            mask_threshold=check_fraction("mask_threshold", o["mask_threshold"]),
                            overlap_threshold=check_fraction("overlap_threshold", o["overlap_threshold"]))

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from .data import resolve_panoptic_data
        return resolve_panoptic_data(data)

    def prepare_model(self, model, data) -> None:
        """The dataset's things become the model's ``thing_class_ids`` (saved with its checkpoints)."""
        model.meta["thing_class_ids"] = list(data.things)

    def datasets(self, data, imgsz, model, options: PanopticOptions):
        import functools

        from .data import PanopticDataset, check_samples, collate_panoptic
        check_samples(data)
        train = PanopticDataset(data.train, imgsz, data.nc, data.things, model.preprocess, augment=True,
                                fliplr=options.fliplr)
        val = PanopticDataset(data.val, imgsz, data.nc, data.things, model.preprocess)
        return train, val, functools.partial(collate_panoptic, bucket=options.bucket)

    def target_rows(self, targets) -> int:
        return int(targets[0].shape[1])   # (B, M) classes, (B, M) mask, (B, M, h, w) masks

    def pad_target_rows(self, targets, rows: int) -> list:
        import torch.nn.functional as F
        cls, valid, masks = targets
        more = rows - cls.shape[1]
        if more < 0:
            raise ValueError(f"cannot pad {cls.shape[1]} target rows to {rows}")
        return [F.pad(cls, (0, more)), F.pad(valid, (0, more), value=False), F.pad(masks, (0, 0, 0, 0, 0, more))]

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: PanopticOptions):
        from .metrics import PanopticEvaluator
        return PanopticEvaluator(model, options, thing_ids(model))

    def metric_columns(self, metrics) -> dict[str, float]:
        return {f"metrics/{k}": metrics[k] for k in ("pq", "sq", "rq", "pq_things", "pq_stuff")}

    def summary(self, metrics) -> str:
        return (f"PQ {metrics['pq']:.4f}  SQ {metrics['sq']:.4f}  RQ {metrics['rq']:.4f}  "
                f"PQ_th {metrics['pq_things']:.4f}  PQ_st {metrics['pq_stuff']:.4f}")

    def empty_metrics(self) -> dict[str, float]:
        return {k: float("nan") for k in ("pq", "sq", "rq", "pq_things", "pq_stuff")}
