"""The restore task's ONNX graph (``model.export(format="onnx")``): the network on a tile."""
from __future__ import annotations

import torch
from torch import nn


class RestoreGraph(nn.Module):
    """images (B, 3, S, S) RGB in [0, 1] -> restored (B, 3, scale*S, scale*S) in [0, 1]: the network
    on one batch of tiles, clamped (predict's tiling and blending stay on the host side)."""

    def __init__(self, model, net: nn.Module, *, half: bool):
        super().__init__()
        self.net = net
        self.infer = model.infer_with(net)
        self.half = half

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.infer(images.half() if self.half else images)
        return out.float().clamp(0.0, 1.0)


def restore_graph(model, net: nn.Module, x: torch.Tensor, half: bool, axes: dict):
    """(graph, inputs, input names, output names, dynamic axes) for the exporter."""
    axes.update(restored={0: "batch", 2: "out_height", 3: "out_width"})
    return RestoreGraph(model, net, half=half), (x,), ["images"], ["restored"], axes
