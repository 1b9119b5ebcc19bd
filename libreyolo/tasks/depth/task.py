"""Monocular depth: a relative (inverse) depth value per pixel.

Predict stage (on the device, captured): ``model.infer`` gives the depth map (B, 1, S, S) at the
network's square input size (the preprocessing stretched each image to it); the stage drops the
channel axis and - in the stage that starts from uint8 images, whose size is then fixed and part
of the graph's key - resizes the map back to the images' (h, w) (bilinear, align_corners=True, as
Depth Anything's own inference does), so one graph runs resize -> network -> resize back. The
stage that starts from a preprocessed batch serves images of every size; its maps are resized
after it, on the device, by the same function (identical numbers). The maps of a chunk reach the
host in one copy (through pinned memory: :func:`download`) and become ``Results.depth``
(:class:`~.results.DepthMap`).
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


#: below this many torch threads a map is copied to the host directly (see :func:`download`)
STAGE_MIN_THREADS = 2


def download(t: torch.Tensor) -> torch.Tensor:
    """A device tensor's copy in (pageable) host memory, through pinned memory.

    A float32 map at the image's size is megabytes (1280x720: 3.7 MB), which a direct copy to
    pageable memory moves through the driver's staging buffers; the copy into pinned memory
    (:func:`~libreyolo.graphs.capture.to_host`) runs at the link's speed and torch's multi-threaded
    copy then moves it out, so that the pinned block goes back to torch's allocator instead of
    living on in the results (the same trade as the predictor's uploads). With a single torch
    thread, or on the CPU, it is a plain ``.cpu()``. The numbers are the same either way.
    """
    if t.device.type != "cuda" or torch.get_num_threads() < STAGE_MIN_THREADS:
        return t.cpu()
    from ...graphs.capture import to_host
    pinned = to_host(t).wait()
    return torch.empty(pinned.shape, dtype=pinned.dtype).copy_(pinned)


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
        host = download(torch.cat([d.reshape(-1) for d in maps]) if len(maps) > 1 else maps[0].reshape(-1))
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
