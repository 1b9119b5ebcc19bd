"""The restore task's ONNX graph (``model.export(format="onnx")``): the network on a tile."""
from __future__ import annotations

import torch
from torch import nn


class RestoreGraph(nn.Module):
    """images (B, 3, S, S) RGB in [0, 1] -> restored (B, 3, scale*S, scale*S) in [0, 1]: the network
    on one batch of tiles, clamped; and ``unclamped``, the same before the clamp, which predict's
    blending of overlapping tiles reads (eager predict blends first and clamps the picture once:
    :class:`libreyolo.export.restore_model.OnnxRestoreModel` does the same from this output)."""

    def __init__(self, model, net: nn.Module, *, half: bool):
        super().__init__()
        self.net = net
        self.infer = model.infer_with(net)
        self.half = half

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.infer(images.half() if self.half else images).float()
        return out.clamp(0.0, 1.0), out


def restore_graph(model, net: nn.Module, x: torch.Tensor, half: bool, axes: dict):
    """(graph, inputs, input names, output names, dynamic axes) for the exporter."""
    out_axes = {0: "batch", 2: "out_height", 3: "out_width"}
    axes.update(restored=out_axes, unclamped=dict(out_axes))
    return RestoreGraph(model, net, half=half), (x,), ["images"], ["restored", "unclamped"], axes
