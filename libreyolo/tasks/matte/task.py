"""Matting: a foreground alpha in [0, 1] per pixel (dichotomous segmentation / background removal).

Predict stage (on the device): ``model.infer`` gives the matte logit (B, 1, S, S) at the network's
input size; the stage applies the sigmoid. After the stage each image's alpha is cut to the part
of the square its image covers (letterbox modes; BiRefNet stretches, so nothing is cut), resized
bilinearly to the image's (h, w) on the device; the alphas of a chunk then
reach the host in one copy and become ``Results.alpha`` (:class:`~.results.Alpha`).

A family whose network cannot be captured whole declares a seam (``Model.PREDICT_SEAM``): the
predictor then captures only its front part and runs the rest and this stage's sigmoid eager
(see ``engine/predictor.py``); the numbers are the same either way.

No training: the families of this task load trained checkpoints (the library this one replaces
trains none of them either).
"""
from __future__ import annotations

import torch.nn.functional as F

from ..base import PredictPlan, Task, host_views

LETTERBOX_MODES = ("topleft", "center", "stretch")


class MattePlan(PredictPlan):
    """One matte predict call (see the module docstring)."""

    tag = ("sigmoid",)

    def __init__(self, model):
        self.model = model

    def finish(self, logits, *extra):
        return logits.float().sigmoid()

    def results(self, out, chunk, size, speed):
        from ...ops.letterbox import image_region
        from ...results import Results
        from .results import Alpha
        m = self.model
        mode = m.preprocess.resize
        maps = []
        for i, it in enumerate(chunk):
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            a = image_region(out[i:i + 1], h, w, size, mode)
            if tuple(a.shape[-2:]) != (h, w):
                a = F.interpolate(a, size=(h, w), mode="bilinear", align_corners=False)
            maps.append(a.reshape(h, w))   # bilinear weights are convex: still in [0, 1]
        return [Results(it.image, it.name, m.names, None, speed=dict(speed), alpha=Alpha(data))
                for it, data in zip(chunk, host_views(maps))]


class MatteTask(Task):
    name = "matte"
    primary_metric = ""
    predict_defaults: dict = {}

    def plan(self, model, size, constants, **opts) -> MattePlan:
        mode = model.preprocess.resize
        if mode not in LETTERBOX_MODES:
            raise ValueError(f"matting needs a resize that keeps the whole image ({', '.join(LETTERBOX_MODES)}); "
                             f"this model's preprocess resize is {mode!r}, which crops it")
        return MattePlan(model)

    def resolve_data(self, data):
        raise NotImplementedError("training and validation are not implemented for the matte task "
                                  "(its families load trained checkpoints)")

    def evaluator(self, model, options):
        raise NotImplementedError("validation is not implemented for the matte task")
