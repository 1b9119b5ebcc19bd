"""PIDNet semantic-segmentation network (Xu et al., "PIDNet: A Real-time Semantic Segmentation
Network Inspired by PID Controllers", CVPR 2023), in the LibreYOLO checkpoint layout, which keeps
the original repository's module names (XuJiacong/PIDNet, ``models/pidnet.py``).

Three branches from one stem (``conv1``: two stride-2 3x3 convs with bias, BatchNorm, ReLU):

* I (integral, context): ``layer1``-``layer4`` (basic residual blocks, strides 1, 2, 2, 2),
  ``layer5`` (two bottlenecks, stride 2) and the pyramid pooling ``spp`` (PAPPM for s and m,
  DAPPM for l), at 1/8 ... 1/64 of the input;
* P (proportional, detail): ``layer3_``, ``layer4_``, ``layer5_`` at 1/8, fed the I branch through
  the pixel-attention-guided fusions ``pag3`` / ``pag4`` (a sigmoid similarity of the two, per
  pixel, mixes the upsampled I features into P; the I side compressed by ``compression3`` /
  ``compression4``);
* D (derivative, boundaries): ``layer3_d``, ``layer4_d``, ``layer5_d`` at 1/8, with the I branch's
  ``diff3`` / ``diff4`` maps added after upsampling.

``dfm`` (Light-Bag for s and m, Bag for l) fuses them: ``sigmoid(D)`` weighs detail (P) against
context (I); ``final_layer`` (BN, ReLU, 3x3 conv, BN, ReLU, 1x1 conv) gives the class logits at
1/8 of the input. Every resize inside the network is bilinear with ``align_corners=False`` (the
original's ``algc``; through ``ops.interpolate.resize_bilinear``: the same forward, a deterministic
backward), every BatchNorm keeps PyTorch's eps 1e-5, momentum 0.1.

Training adds the original's two auxiliary heads (:meth:`PIDNetNet.add_aux_heads`):
``seghead_p`` (class logits from the P branch after ``pag3``) and ``seghead_d`` (one boundary logit
from the D branch after ``diff4``), which give the losses their P and D terms. The LibreYOLO
checkpoint layout (the fixture) has no auxiliary heads: they run only in training, and a network
built for inference (:func:`PIDNetNet`'s default) holds none.

Input: RGB in [0, 1]; the network normalizes it with the ImageNet mean / std (non-persistent
buffers, not in the layout), as the reference does. Shapes derive from the input's static size:
no host syncs and no data-dependent shapes. Sizes s / m / l follow the original's
``pidnet_small`` / ``pidnet_medium`` / ``pidnet_large``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.interpolate import resize_bilinear

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: the checkpoint prefixes of the training-only heads
AUX_PREFIXES = ("seghead_p.", "seghead_d.")


@dataclass(frozen=True)
class PIDNetConfig:
    m: int             # basic blocks per stage of layer1 / layer2 and of the P branch
    n: int             # basic blocks per stage of layer3 / layer4
    planes: int        # stem width
    ppm_planes: int    # pyramid pooling branch width
    head_planes: int   # segmentation head width


CONFIGS: dict[str, PIDNetConfig] = {
    "s": PIDNetConfig(2, 3, 32, 96, 128),
    "m": PIDNetConfig(2, 3, 64, 96, 128),
    "l": PIDNetConfig(3, 4, 64, 112, 256),
}


def _up(x: torch.Tensor, size) -> torch.Tensor:
    """Bilinear resize, ``align_corners=False``: ``F.interpolate``'s forward with a deterministic
    backward (``ops.interpolate``)."""
    return resize_bilinear(x, tuple(size))


def _conv_bn(c_in: int, c_out: int, k: int = 1, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, k, stride, k // 2, bias=False), nn.BatchNorm2d(c_out))


def _bn_relu_conv(c_in: int, c_out: int, k: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm2d(c_in), nn.ReLU(), nn.Conv2d(c_in, c_out, k, padding=k // 2, groups=groups,
                                                                      bias=False))


class BasicBlock(nn.Module):
    """3x3 conv-BN-ReLU, 3x3 conv-BN, plus the (projected) input; ReLU unless ``no_relu``."""

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 no_relu: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.no_relu = no_relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        out = out + (x if self.downsample is None else self.downsample(x))
        return out if self.no_relu else F.relu(out)


class Bottleneck(nn.Module):
    """1x1 conv, 3x3 conv (stride), 1x1 conv to twice ``planes``, plus the input; by default no
    ReLU after the sum (the original's default for this block)."""

    expansion = 2

    def __init__(self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 no_relu: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 2, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 2)
        self.downsample = downsample
        self.no_relu = no_relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out = out + (x if self.downsample is None else self.downsample(x))
        return out if self.no_relu else F.relu(out)


def _downsample(block, c_in: int, planes: int, stride: int) -> nn.Module | None:
    if stride == 1 and c_in == planes * block.expansion:
        return None
    return _conv_bn(c_in, planes * block.expansion, 1, stride)


def make_layer(block, c_in: int, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
    """``blocks`` blocks, the first with the stride and projection; the last without its ReLU."""
    layers = [block(c_in, planes, stride, _downsample(block, c_in, planes, stride))]
    c_in = planes * block.expansion
    for i in range(1, blocks):
        layers.append(block(c_in, planes, no_relu=i == blocks - 1))
    return nn.Sequential(*layers)


def make_single_layer(block, c_in: int, planes: int) -> nn.Module:
    """One block with its projection and no ReLU after the sum."""
    return block(c_in, planes, 1, _downsample(block, c_in, planes, 1), no_relu=True)


class SegmentHead(nn.Module):
    """BN, ReLU, 3x3 conv, BN, ReLU, 1x1 conv with bias."""

    def __init__(self, c_in: int, c_mid: int, c_out: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_mid, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_mid)
        self.conv2 = nn.Conv2d(c_mid, c_out, 1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(F.relu(self.bn1(x)))
        return self.conv2(F.relu(self.bn2(x)))


def _pool_branch(kernel: int, stride: int, c_in: int, c_out: int) -> nn.Sequential:
    """Average pooling (or a global one for ``kernel`` 0), then BN, ReLU, 1x1 conv."""
    pool = nn.AdaptiveAvgPool2d((1, 1)) if kernel == 0 else nn.AvgPool2d(kernel, stride, kernel // 2)
    return nn.Sequential(pool, *_bn_relu_conv(c_in, c_out))


class PAPPM(nn.Module):
    """Parallel aggregation pyramid pooling (s, m): four pooled scales plus the map itself, each
    pooled scale upsampled and added to the unpooled branch, one grouped 3x3 conv over the four,
    compressed and added to a 1x1 shortcut."""

    def __init__(self, c_in: int, c_mid: int, c_out: int):
        super().__init__()
        self.scale1 = _pool_branch(5, 2, c_in, c_mid)
        self.scale2 = _pool_branch(9, 4, c_in, c_mid)
        self.scale3 = _pool_branch(17, 8, c_in, c_mid)
        self.scale4 = _pool_branch(0, 0, c_in, c_mid)
        self.scale0 = _bn_relu_conv(c_in, c_mid)
        self.scale_process = _bn_relu_conv(c_mid * 4, c_mid * 4, 3, groups=4)
        self.compression = _bn_relu_conv(c_mid * 5, c_out)
        self.shortcut = _bn_relu_conv(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        x0 = self.scale0(x)
        scales = [_up(s(x), size) + x0 for s in (self.scale1, self.scale2, self.scale3, self.scale4)]
        out = self.scale_process(torch.cat(scales, 1))
        return self.compression(torch.cat([x0, out], 1)) + self.shortcut(x)


class DAPPM(nn.Module):
    """Deep aggregation pyramid pooling (l): as PAPPM, but each scale is refined by its own 3x3
    conv after adding the previous scale's result (a sequential cascade)."""

    def __init__(self, c_in: int, c_mid: int, c_out: int):
        super().__init__()
        self.scale1 = _pool_branch(5, 2, c_in, c_mid)
        self.scale2 = _pool_branch(9, 4, c_in, c_mid)
        self.scale3 = _pool_branch(17, 8, c_in, c_mid)
        self.scale4 = _pool_branch(0, 0, c_in, c_mid)
        self.scale0 = _bn_relu_conv(c_in, c_mid)
        self.process1 = _bn_relu_conv(c_mid, c_mid, 3)
        self.process2 = _bn_relu_conv(c_mid, c_mid, 3)
        self.process3 = _bn_relu_conv(c_mid, c_mid, 3)
        self.process4 = _bn_relu_conv(c_mid, c_mid, 3)
        self.compression = _bn_relu_conv(c_mid * 5, c_out)
        self.shortcut = _bn_relu_conv(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        outs = [self.scale0(x)]
        for scale, process in ((self.scale1, self.process1), (self.scale2, self.process2),
                               (self.scale3, self.process3), (self.scale4, self.process4)):
            outs.append(process(_up(scale(x), size) + outs[-1]))
        return self.compression(torch.cat(outs, 1)) + self.shortcut(x)


class PagFM(nn.Module):
    """Pixel-attention-guided fusion: ``sigma = sigmoid(sum_c f_x(x) * up(f_y(y)))`` per pixel,
    then ``(1 - sigma) * x + sigma * up(y)`` (x: the P branch, y: the compressed I branch)."""

    def __init__(self, c_in: int, c_mid: int):
        super().__init__()
        self.f_x = _conv_bn(c_in, c_mid)
        self.f_y = _conv_bn(c_in, c_mid)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        y_q = _up(self.f_y(y), size)
        sim = torch.sigmoid((self.f_x(x) * y_q).sum(1, keepdim=True))
        return (1 - sim) * x + sim * _up(y, size)


class LightBag(nn.Module):
    """Light boundary-attention-guided fusion (s, m): with ``a = sigmoid(d)``,
    ``conv_p((1 - a) * i + p) + conv_i(i + a * p)``."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv_p = _conv_bn(c_in, c_out)
        self.conv_i = _conv_bn(c_in, c_out)

    def forward(self, p: torch.Tensor, i: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(d)
        return self.conv_p((1 - a) * i + p) + self.conv_i(i + a * p)


class Bag(nn.Module):
    """Boundary-attention-guided fusion (l): BN, ReLU, 3x3 conv of ``a * p + (1 - a) * i``."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = _bn_relu_conv(c_in, c_out, 3)

    def forward(self, p: torch.Tensor, i: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(d)
        return self.conv(a * p + (1 - a) * i)


class PIDNetNet(nn.Module):
    """PIDNet: ``forward(x)`` maps RGB in [0, 1] (B, 3, H, W), H and W multiples of 8, to class
    logits (B, nc, H/8, W/8); in training mode with the auxiliary heads (``aux=True`` or
    :meth:`add_aux_heads`) to ``(P logits, main logits, boundary logit)``, each at 1/8."""

    def __init__(self, size: str, nc: int, aux: bool = False):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown PIDNet size {size!r}; expected one of {sorted(CONFIGS)}")
        if nc < 1:
            raise ValueError(f"PIDNet nc must be a positive number of classes, got {nc}")
        cfg = CONFIGS[size]
        self.size, self.nc, self.cfg = size, nc, cfg
        m, n, c = cfg.m, cfg.n, cfg.planes
        self.conv1 = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU(),
                                   nn.Conv2d(c, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU())
        # I branch
        self.layer1 = make_layer(BasicBlock, c, c, m)
        self.layer2 = make_layer(BasicBlock, c, c * 2, m, 2)
        self.layer3 = make_layer(BasicBlock, c * 2, c * 4, n, 2)
        self.layer4 = make_layer(BasicBlock, c * 4, c * 8, n, 2)
        self.layer5 = make_layer(Bottleneck, c * 8, c * 8, 2, 2)
        # P branch
        self.compression3 = _conv_bn(c * 4, c * 2)
        self.compression4 = _conv_bn(c * 8, c * 2)
        self.pag3 = PagFM(c * 2, c)
        self.pag4 = PagFM(c * 2, c)
        self.layer3_ = make_layer(BasicBlock, c * 2, c * 2, m)
        self.layer4_ = make_layer(BasicBlock, c * 2, c * 2, m)
        self.layer5_ = make_layer(Bottleneck, c * 2, c * 2, 1)
        # D branch
        if m == 2:
            self.layer3_d = make_single_layer(BasicBlock, c * 2, c)
            self.layer4_d = make_layer(Bottleneck, c, c, 1)
            self.diff3 = _conv_bn(c * 4, c, 3)
            self.diff4 = _conv_bn(c * 8, c * 2, 3)
            self.spp = PAPPM(c * 16, cfg.ppm_planes, c * 4)
            self.dfm = LightBag(c * 4, c * 4)
        else:
            self.layer3_d = make_single_layer(BasicBlock, c * 2, c * 2)
            self.layer4_d = make_single_layer(BasicBlock, c * 2, c * 2)
            self.diff3 = _conv_bn(c * 4, c * 2, 3)
            self.diff4 = _conv_bn(c * 8, c * 2, 3)
            self.spp = DAPPM(c * 16, cfg.ppm_planes, c * 4)
            self.dfm = Bag(c * 4, c * 4)
        self.layer5_d = make_layer(Bottleneck, c * 2, c * 2, 1)
        self.final_layer = SegmentHead(c * 4, cfg.head_planes, nc)
        self.seghead_p: SegmentHead | None = None
        self.seghead_d: SegmentHead | None = None
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self._init_weights(self)
        if aux:
            self.add_aux_heads()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """The original's initialisation: Kaiming-normal convs (fan-out, ReLU), zero biases,
        BatchNorm scale 1 and shift 0."""
        for mod in module.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)
            elif isinstance(mod, nn.BatchNorm2d):
                nn.init.ones_(mod.weight)
                nn.init.zeros_(mod.bias)

    @property
    def has_aux(self) -> bool:
        return self.seghead_p is not None

    def add_aux_heads(self) -> PIDNetNet:
        """Attach the training-only heads (``seghead_p``: P-branch class logits, ``seghead_d``:
        D-branch boundary logit; freshly initialised, on the network's device); no-op when present."""
        if self.has_aux:
            return self
        c = self.cfg.planes
        p = SegmentHead(c * 2, self.cfg.head_planes, self.nc)
        d = SegmentHead(c * 2, c, 1)
        for head in (p, d):
            self._init_weights(head)
        ref = self.final_layer.conv2.weight
        self.seghead_p = p.to(ref.device)
        self.seghead_d = d.to(ref.device)
        return self

    def forward(self, x: torch.Tensor):
        x = (x - self.mean) / self.std
        out_size = (x.shape[-2] // 8, x.shape[-1] // 8)
        x = self.conv1(x)
        x = self.layer1(x)
        x = F.relu(self.layer2(F.relu(x)))
        x_p = self.layer3_(x)
        x_d = self.layer3_d(x)

        x = F.relu(self.layer3(x))
        x_p = self.pag3(x_p, self.compression3(x))
        x_d = x_d + _up(self.diff3(x), out_size)
        aux_p = x_p

        x = F.relu(self.layer4(x))
        x_p = self.layer4_(F.relu(x_p))
        x_d = self.layer4_d(F.relu(x_d))
        x_p = self.pag4(x_p, self.compression4(x))
        x_d = x_d + _up(self.diff4(x), out_size)
        aux_d = x_d

        x_p = self.layer5_(F.relu(x_p))
        x_d = self.layer5_d(F.relu(x_d))
        x = _up(self.spp(self.layer5(x)), out_size)
        logits = self.final_layer(self.dfm(x_p, x, x_d))
        if self.training and self.seghead_p is not None and self.seghead_d is not None:
            return self.seghead_p(aux_p), logits, self.seghead_d(aux_d)
        return logits
