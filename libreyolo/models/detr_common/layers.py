"""Small layers shared by the DETR blocks: conv+norm, MLP heads, inverse sigmoid, fusing.

The attribute names (``conv``/``norm``, ``layers``) are part of the checkpoint layout.
"""
from __future__ import annotations

import torch
from torch import nn

from ..common.blocks import fold_bn


def activation(name: str | None) -> nn.Module:
    """'relu' / 'silu' / 'gelu' -> the module; None -> identity."""
    if name is None:
        return nn.Identity()
    acts = {"relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU}
    if name not in acts:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(acts)}")
    return acts[name]()


class ConvNorm(nn.Module):
    """Conv2d (no bias, 'same' padding, ``groups``) -> BatchNorm2d -> activation; ``fuse`` folds the norm."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, act: str | None = None, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, (k - 1) // 2, groups=groups, bias=False)
        self.norm: nn.Module = nn.BatchNorm2d(c_out)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm into the convolution (inference only)."""
        if isinstance(self.norm, nn.BatchNorm2d):
            self.conv = fold_conv_bn(self.conv, self.norm)
            self.norm = nn.Identity()


@torch.no_grad()
def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A new Conv2d (with bias) equal to ``bn(conv(x))`` in eval mode."""
    w, b = fold_bn(conv.weight, conv.bias, bn)
    out = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                    conv.dilation, conv.groups, bias=True).to(device=w.device, dtype=w.dtype)
    out.weight.copy_(w)
    out.bias.copy_(b)
    return out.requires_grad_(False)


class MLP(nn.Module):
    """``num_layers`` Linear layers (keys ``layers.<i>``) with ``act`` (ReLU by default) between
    them, none after the last."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, num_layers: int, act: str | None = "relu"):
        super().__init__()
        dims = [d_in] + [d_hidden] * (num_layers - 1) + [d_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < last:
                x = self.act(x)
        return x


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """logit(x) with x clipped to [0, 1] and both odds terms kept >= eps (finite everywhere)."""
    x = x.clamp(0.0, 1.0)
    return torch.log(x.clamp(min=eps) / (1.0 - x).clamp(min=eps))


@torch.no_grad()
def fuse_detr(root: nn.Module) -> nn.Module:
    """Fold every BatchNorm that follows a convolution below ``root`` and re-parameterize
    RepVGG blocks, in place (inference only)."""
    for m in list(root.modules()):
        fuse = getattr(m, "reparameterize", None)
        if fuse is not None:
            fuse()
    for m in list(root.modules()):
        if isinstance(m, ConvNorm):
            m.fuse()
        elif isinstance(m, nn.Sequential) and len(m) == 2:
            (n0, conv), (n1, bn) = list(m.named_children())
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                setattr(m, n0, fold_conv_bn(conv, bn))
                setattr(m, n1, nn.Identity())
    return root
