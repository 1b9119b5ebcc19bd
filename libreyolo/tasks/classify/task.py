"""Image classification: class probabilities, top-k, top-1 / top-5 accuracy.

Predict stage (on the device, captured with the network): logits -> softmax -> top-k (``topk``,
default 5), packed into one (B, nc + 2k) float tensor - probabilities, top-k probabilities, top-k
class ids - copied to the host once; :meth:`ClassifyPlan.results` wraps each row in a
:class:`~libreyolo.tasks.classify.results.Probs`.

Training: ImageFolder datasets, a YAML pointing at one, or the built-in ``shapes-cls`` set
(:mod:`libreyolo.data.imagefolder`); torchvision.transforms.v2 augmentation and soft targets
(:mod:`.data`); soft-target cross-entropy (label smoothing folded into the targets); validation
top-1 / top-5 accuracy, fitness = top-1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...options import Choice, Float, Fraction, check_fields, option
from ..base import Evaluator, PredictPlan, Task, TaskOptions
from .data import AUTO_AUGMENT


@dataclass
class ClassifyOptions(TaskOptions):
    """Classification training options."""

    label_smoothing: float = option(0.1, "eps of the smoothed targets (cross-entropy with label smoothing)",
                                    Float(0.0, 1.0, max_inclusive=False))
    auto_augment: str = option("none", "trivialaugment, randaugment or none (long ImageNet-style runs: on)",
                               Choice(*AUTO_AUGMENT))
    mixup: float = option(0.0, "MixUp's Beta alpha, 0 = off (ImageNet recipes: 0.8)", Float(0.0))
    cutmix: float = option(0.0, "CutMix's Beta alpha, 0 = off (ImageNet recipes: 1.0)", Float(0.0))
    fliplr: float = option(0.5, "probability of a horizontal flip", Fraction())
    scale: float = option(0.35, "RandomResizedCrop's smallest area fraction (ImageNet from scratch: 0.08)",
                          Float(0.0, 1.0, min_inclusive=False))

    def __post_init__(self) -> None:
        check_fields(self)


class ClassifyPlan(PredictPlan):
    """One classification predict call: softmax and the top ``k`` classes inside the stage."""

    host = True

    def __init__(self, model, k: int):
        self.model = model
        self.nc = int(model.nc)
        self.k = min(int(k), self.nc)
        self.tag = ("topk", self.k)
        # a family whose classes are scored one by one (SigLIP 2's text prompts): a sigmoid per class
        self.sigmoid = getattr(model, "PROBS", "softmax") == "sigmoid"
        if self.sigmoid:
            self.tag += ("sigmoid",)

    def finish(self, logits: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        probs = logits.float().sigmoid() if self.sigmoid else logits.float().softmax(-1)
        conf, idx = probs.topk(self.k, dim=-1)
        return torch.cat((probs, conf, idx.to(probs.dtype)), 1)   # ids < 2**24 are exact in float32

    def results(self, out, chunk, size, speed):
        from ...results import Results
        from .results import Probs
        host = out.wait()
        nc, k = self.nc, self.k
        results = []
        for i, it in enumerate(chunk):
            row = host[i]
            # copies: the pinned host buffer is reused by a later call's outputs
            probs = Probs(row[:nc].clone(), row[nc + k:].long().tolist(), row[nc:nc + k].clone())
            results.append(Results(it.image, it.name, self.model.names, None, speed=dict(speed), probs=probs))
        return results


class ClassificationEvaluator(Evaluator):
    """Top-1 and top-5 accuracy over a validation split (counts kept on the device)."""

    def __init__(self, model):
        self.k = min(5, int(model.nc))
        self.reset()

    def reset(self) -> None:
        self.correct1 = self.correct5 = None
        self.n = 0

    def process(self, outputs: torch.Tensor, batch) -> None:
        labels = batch[1].to(outputs.device, non_blocking=True).argmax(1)
        top = outputs.topk(self.k, dim=1).indices
        hit = top == labels[:, None]
        c1, c5 = hit[:, 0].sum(), hit.any(1).sum()
        self.correct1 = c1 if self.correct1 is None else self.correct1 + c1
        self.correct5 = c5 if self.correct5 is None else self.correct5 + c5
        self.n += int(labels.shape[0])

    def evaluate(self) -> dict[str, float]:
        if self.n == 0:
            return {"top1": float("nan"), "top5": float("nan")}
        return {"top1": int(self.correct1) / self.n, "top5": int(self.correct5) / self.n}


class ClassifyLoss(nn.Module):
    """Cross-entropy of logits (B, nc) against soft targets (B, nc) (probabilities): the mean over
    the batch. Label smoothing is already in the targets (the collate's), which is the same as
    ``F.cross_entropy(..., label_smoothing=eps)`` on the unsmoothed ones. Fixed shapes, no host
    synchronisation: the step can be captured whole."""

    item_names = ("cls",)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss = F.cross_entropy(logits.float(), targets.float())
        return loss, loss.detach().reshape(1)


def set_prompts(model, prompts) -> None:
    """``prompts`` (a list, or text with the prompts separated by commas) become ``model``'s
    classes (its ``set_classes``; unchanged prompts are not encoded again)."""
    items = [p.strip() for p in prompts.split(",")] if isinstance(prompts, str) else prompts
    if getattr(model, "set_classes", None) is None:
        raise ValueError(f"prompts= needs a model with a text tower (CLIP, SigLIP 2); {model.FAMILY} classifies "
                         "into its trained classes")
    if list(model.names.values()) != list(items) or getattr(model, "_prompts", None) is None:
        model.set_classes(items)


class ClassifyTask(Task):
    name = "classify"
    primary_metric = "top1"
    Options = ClassifyOptions
    predict_defaults = {"topk": 5, "prompts": None}

    def plan(self, model, size, constants, **opts) -> ClassifyPlan:
        o = {**self.predict_defaults, **opts}
        if o["prompts"] is not None:   # zero-shot classes of a model with a text tower (CLIP, SigLIP 2)
            set_prompts(model, o["prompts"])
        try:
            k = int(o["topk"])
        except (TypeError, ValueError):
            raise ValueError(f"topk must be a positive int, got {o['topk']!r}") from None
        if k < 1 or k != o["topk"]:
            raise ValueError(f"topk must be a positive int, got {o['topk']!r}")
        plan = ClassifyPlan(model, k)
        plan.reusable = o["prompts"] is None   # prompts set the model's classes: each call checks them again
        return plan

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from ...data.imagefolder import resolve_classify_data
        return resolve_classify_data(data)

    def datasets(self, data, imgsz, model, options: ClassifyOptions):
        from .data import ClassifyCollate, ClassifyDataset
        o = options
        prep = model.preprocess
        train = ClassifyDataset(data.train, imgsz, prep, augment=True, scale=o.scale, fliplr=o.fliplr,
                                auto_augment=o.auto_augment)
        val = ClassifyDataset(data.val, imgsz, prep, augment=False)
        return train, val, ClassifyCollate(data.nc, mixup=o.mixup, cutmix=o.cutmix,
                                           label_smoothing=o.label_smoothing)

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options) -> ClassificationEvaluator:
        return ClassificationEvaluator(model)

    def metric_columns(self, metrics) -> dict[str, float]:
        return {"metrics/top1": metrics["top1"], "metrics/top5": metrics["top5"]}

    def summary(self, metrics) -> str:
        return f"top1 {metrics['top1']:.4f}  top5 {metrics['top5']:.4f}"

    def empty_metrics(self) -> dict[str, float]:
        return {"top1": float("nan"), "top5": float("nan")}

    # ------------------------------------------------------------------ loss
    def build_loss(self, model) -> ClassifyLoss:
        return ClassifyLoss()
