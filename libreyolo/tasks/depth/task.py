"""Monocular depth: a relative (inverse) depth value per pixel.

Predict stage (on the device, captured): ``model.infer`` gives the depth map (B, 1, S, S) at the
network's square input size (the preprocessing stretched each image to it); the stage drops the
channel axis and - in the stage that starts from uint8 images, whose size is then fixed and part
of the graph's key - resizes the map back to the images' (h, w) (bilinear, align_corners=True, as
Depth Anything's own inference does), so one graph runs resize -> network -> resize back. The
stage that starts from a preprocessed batch serves images of every size; its maps are resized
after it, on the device, by the same function (identical numbers). The maps of a chunk reach the
host in one copy and become ``Results.depth`` (:class:`~.results.DepthMap`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..base import PredictPlan, Task
from .results import DepthMap


def resize_depth(depth: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B, H, W) float maps -> (B, h, w): bilinear with align_corners=True (the corner pixels
    keep their values), on their device; the maps themselves when the size already matches."""
    if tuple(depth.shape[-2:]) == (h, w):
        return depth
    return F.interpolate(depth[:, None], size=(int(h), int(w)), mode="bilinear", align_corners=True)[:, 0]


def check_resize(mode: str) -> None:
    """The map is stretched back to the image, which only the "stretch" resize undoes exactly."""
    if mode != "stretch":
        raise ValueError(f"the depth task maps its output back by stretching, so it needs the 'stretch' "
                         f"preprocess resize; this model's preprocess resize is {mode!r}")


class DepthPlan(PredictPlan):
    """One depth predict call (see the module docstring)."""

    tag = ("depth",)

    def __init__(self, model):
        self.model = model

    def finish(self, depth, *extra):
        return depth[:, 0]

    def to_source(self, depth, hw):
        return resize_depth(depth, *hw)

    def results(self, out, chunk, size, speed):
        from ...results import Results
        m = self.model
        maps = [resize_depth(out[i:i + 1], int(it.image.shape[0]), int(it.image.shape[1]))[0]
                for i, it in enumerate(chunk)]
        host = torch.cat([d.reshape(-1) for d in maps]).cpu() if len(maps) > 1 else maps[0].reshape(-1).cpu()
        results, start = [], 0
        for it, d in zip(chunk, maps):
            n = d.numel()
            data = host[start:start + n].view(d.shape)
            start += n
            results.append(Results(it.image, it.name, m.names, None, speed=dict(speed), depth=DepthMap(data)))
        return results


class DepthTask(Task):
    name = "depth"
    predict_defaults: dict = {}

    def plan(self, model, size, constants, **opts) -> DepthPlan:
        check_resize(model.preprocess.resize)
        return DepthPlan(model)
