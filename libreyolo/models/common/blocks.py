"""Convolutional building blocks shared by the CNN detector families.

The attribute names (``conv``/``bn``, ``cv1``..``cv5``, ``conv1``/``conv2``) are
part of the LibreYOLO checkpoint layout and must not be renamed. Every block
that holds a BatchNorm can be folded for inference through :func:`fuse_modules`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BN_EPS = 1e-3
BN_MOMENTUM = 0.03


class ConvBN(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU (or identity when ``act=False``)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, p: int | None = None,
                 g: int = 1, act: bool = True):
        super().__init__()
        pad = k // 2 if p is None else p
        self.conv = nn.Conv2d(c_in, c_out, k, s, pad, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bn is None:  # folded by fuse()
            return self.act(self.conv(x))
        return self.act(self.bn(self.conv(x)))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm into the convolution (inference only)."""
        if self.bn is None:
            return
        w, b = fold_bn(self.conv.weight, None, self.bn)
        conv = nn.Conv2d(self.conv.in_channels, self.conv.out_channels, self.conv.kernel_size,
                         self.conv.stride, self.conv.padding, groups=self.conv.groups, bias=True)
        conv.to(device=w.device, dtype=w.dtype)
        conv.weight.copy_(w)
        conv.bias.copy_(b)
        conv.requires_grad_(False)
        self.conv = conv
        self.bn = None


def fold_bn(weight: torch.Tensor, bias: torch.Tensor | None, bn: nn.BatchNorm2d):
    """Return (weight, bias) of a convolution followed by ``bn`` in eval mode."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    w = weight * scale.reshape(-1, 1, 1, 1)
    b0 = torch.zeros_like(bn.running_mean) if bias is None else bias
    b = (b0 - bn.running_mean) * scale + bn.bias
    return w, b


class RepConvN(nn.Module):
    """3x3 ConvBN + 1x1 ConvBN summed, then SiLU; re-parameterizable into one 3x3 conv."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv1 = ConvBN(c_in, c_out, 3, act=False)
        self.conv2 = ConvBN(c_in, c_out, 1, act=False)
        self.act = nn.SiLU()
        self.conv = None  # set by fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv is not None:
            return self.act(self.conv(x))
        return self.act(self.conv1(x) + self.conv2(x))

    @torch.no_grad()
    def fuse(self) -> None:
        if self.conv is not None:
            return
        w3, b3 = fold_bn(self.conv1.conv.weight, None, self.conv1.bn)
        w1, b1 = fold_bn(self.conv2.conv.weight, None, self.conv2.bn)
        conv = nn.Conv2d(w3.shape[1], w3.shape[0], 3, 1, 1, bias=True).to(w3.device, w3.dtype)
        conv.weight.copy_(w3 + F.pad(w1, [1, 1, 1, 1]))
        conv.bias.copy_(b3 + b1)
        conv.requires_grad_(False)
        del self.conv1, self.conv2
        self.conv = conv


class RepBottleneck(nn.Module):
    """RepConvN -> ConvBN(3x3) with a residual connection when shapes allow."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True):
        super().__init__()
        self.cv1 = RepConvN(c_in, c_out)
        self.cv2 = ConvBN(c_out, c_out, 3)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class RepCSP(nn.Module):
    """CSP block: two 1x1 branches, one through ``n`` RepBottlenecks, merged by a 1x1."""

    def __init__(self, c_in: int, c_out: int, n: int = 1):
        super().__init__()
        hidden = c_out // 2
        self.cv1 = ConvBN(c_in, hidden, 1)
        self.cv2 = ConvBN(c_in, hidden, 1)
        self.cv3 = ConvBN(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*[RepBottleneck(hidden, hidden) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class ELAN(nn.Module):
    """Plain ELAN: 1x1 split in two, two chained 3x3 convs on the second half, 1x1 merge."""

    def __init__(self, c_in: int, part: int, hidden: int, c_out: int):
        super().__init__()
        self.cv1 = ConvBN(c_in, part, 1)
        self.cv2 = ConvBN(part // 2, hidden, 3)
        self.cv3 = ConvBN(hidden, hidden, 3)
        self.cv4 = ConvBN(part + 2 * hidden, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, 1)
        c = self.cv2(b)
        d = self.cv3(c)
        return self.cv4(torch.cat((a, b, c, d), 1))


class RepNCSPELAN(ELAN):
    """GELAN block: ELAN (same data flow) whose two branches are RepCSP + 3x3 ConvBN."""

    def __init__(self, c_in: int, part: int, hidden: int, c_out: int, n: int = 1):
        nn.Module.__init__(self)
        self.cv1 = ConvBN(c_in, part, 1)
        self.cv2 = nn.Sequential(RepCSP(part // 2, hidden, n), ConvBN(hidden, hidden, 3))
        self.cv3 = nn.Sequential(RepCSP(hidden, hidden, n), ConvBN(hidden, hidden, 3))
        self.cv4 = ConvBN(part + 2 * hidden, c_out, 1)


class AConv(nn.Module):
    """Downsample: 2x2 average pool (stride 1) then a stride-2 3x3 ConvBN."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.cv = ConvBN(c_in, c_out, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv(F.avg_pool2d(x, 2, 1, 0, False, True))


class ADown(nn.Module):
    """Two-path downsample: half through a stride-2 3x3, half through max-pool + 1x1."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.cv1 = ConvBN(c_in // 2, c_out // 2, 3, 2, 1)
        self.cv2 = ConvBN(c_in // 2, c_out // 2, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = F.avg_pool2d(x, 2, 1, 0, False, True).chunk(2, 1)
        return torch.cat((self.cv1(a), self.cv2(F.max_pool2d(b, 3, 2, 1))), 1)


class SPPELAN(nn.Module):
    """1x1 reduce, three chained 5x5 max-pools, concatenate all four, 1x1 expand."""

    def __init__(self, c_in: int, hidden: int, c_out: int, k: int = 5):
        super().__init__()
        self.cv1 = ConvBN(c_in, hidden, 1)
        self.k = k
        self.cv5 = ConvBN(4 * hidden, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(F.max_pool2d(y[-1], self.k, 1, self.k // 2))
        return self.cv5(torch.cat(y, 1))


def fuse_modules(root: nn.Module) -> nn.Module:
    """Fold every BatchNorm and re-parameterize every RepConvN below ``root`` in place."""
    for m in list(root.modules()):
        if isinstance(m, RepConvN):
            m.fuse()
    for m in list(root.modules()):
        if isinstance(m, ConvBN):
            m.fuse()
    return root
