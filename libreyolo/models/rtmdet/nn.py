"""RTMDet network (CSPNeXt backbone, CSPNeXt PAFPN neck, shared-conv SepBN head).

Layout follows the LibreYOLO checkpoints: ``backbone.stem`` / ``backbone.stage1..4``,
``neck.reduce_layers`` / ``top_down_blocks`` / ``downsamples`` / ``bottom_up_blocks`` /
``out_convs`` and ``head.cls_convs`` / ``reg_convs`` / ``rtm_cls`` / ``rtm_reg``.
Size t is pinned by the architecture fixture; s, m and l use the widen/deepen factors of
the original RTMDet configurations.

BatchNorm uses PyTorch's defaults (eps 1e-5, momentum 0.1): the original checkpoints were
trained with those, not the 1e-3 / 0.03 of the YOLO families.

``forward`` returns ``(cls_scores, bbox_preds)``: per level (strides 8, 16, 32) the class
logits (B, nc, H/s, W/s) and the (left, top, right, bottom) distances in input pixels
(B, 4, H/s, W/s) measured from the grid point (col * s, row * s).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...ops.interpolate import resize_bilinear, resize_bilinear_backward
from ..common.blocks import ConvBN, fuse_modules

STRIDES = (8, 16, 32)
RTM_BN_EPS = 1e-5
RTM_BN_MOMENTUM = 0.1


@dataclass(frozen=True)
class RtmdetConfig:
    deepen: float
    widen: float
    exp_on_reg: bool  # box branch predicts log-distances (exp applied) for the larger sizes


CONFIGS: dict[str, RtmdetConfig] = {
    "t": RtmdetConfig(0.167, 0.375, False),
    "s": RtmdetConfig(0.33, 0.5, False),
    "m": RtmdetConfig(0.67, 0.75, True),
    "l": RtmdetConfig(1.0, 1.0, True),
}

# Per backbone stage at widen 1.0: (c_in, c_out, blocks at deepen 1.0, residual, SPPF)
_STAGES = ((64, 128, 3, True, False), (128, 256, 6, True, False),
           (256, 512, 6, True, False), (512, 1024, 3, False, True))


class CBA(ConvBN):
    """ConvBN with RTMDet's BatchNorm settings (SiLU unless ``act=False``)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True):
        super().__init__(c_in, c_out, k, s, None, g, act)
        self.bn = nn.BatchNorm2d(c_out, eps=RTM_BN_EPS, momentum=RTM_BN_MOMENTUM)


class DWSeparable(nn.Module):
    """Depthwise k x k ConvBN-SiLU followed by a pointwise 1x1 ConvBN-SiLU."""

    def __init__(self, c_in: int, c_out: int, k: int):
        super().__init__()
        self.depthwise_conv = CBA(c_in, c_in, k, g=c_in)
        self.pointwise_conv = CBA(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(x))


class NeXtBlock(nn.Module):
    """3x3 ConvBN then a 5x5 depthwise-separable conv, with an optional residual."""

    def __init__(self, c: int, residual: bool):
        super().__init__()
        self.conv1 = CBA(c, c, 3)
        self.conv2 = DWSeparable(c, c, 5)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.residual else y


class ChannelGate(nn.Module):
    """Squeeze-style channel attention: global mean -> 1x1 conv (bias) -> hard sigmoid."""

    def __init__(self, c: int):
        super().__init__()
        self.fc = nn.Conv2d(c, c, 1, bias=True)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc(x.mean((2, 3), keepdim=True)))


class NeXtCSP(nn.Module):
    """CSP layer: two 1x1 halves, one through ``n`` NeXtBlocks, concat (main first), 1x1 out."""

    def __init__(self, c_in: int, c_out: int, n: int, residual: bool, attention: bool):
        super().__init__()
        mid = c_out // 2
        self.main_conv = CBA(c_in, mid, 1)
        self.short_conv = CBA(c_in, mid, 1)
        self.final_conv = CBA(2 * mid, c_out, 1)
        self.blocks = nn.Sequential(*[NeXtBlock(mid, residual) for _ in range(n)])
        if attention:
            self.attention = ChannelGate(2 * mid)
        else:
            self.attention = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat((self.blocks(self.main_conv(x)), self.short_conv(x)), 1)
        if self.attention is not None:
            y = self.attention(y)
        return self.final_conv(y)


class SPPF(nn.Module):
    """1x1 halve, three chained 5x5 stride-1 max-pools, concat the four, 1x1 out."""

    def __init__(self, c_in: int, c_out: int, k: int = 5):
        super().__init__()
        mid = c_in // 2
        self.conv1 = CBA(c_in, mid, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)
        self.conv2 = CBA(4 * mid, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.conv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.conv2(torch.cat(y, 1))


def _depth(n: int, deepen: float) -> int:
    return max(round(n * deepen), 1)


class CSPNeXt(nn.Module):
    """Backbone; returns the stage 2, 3 and 4 maps (strides 8, 16, 32)."""

    def __init__(self, cfg: RtmdetConfig):
        super().__init__()
        w = cfg.widen
        c0 = int(_STAGES[0][0] * w)
        self.stem = nn.Sequential(CBA(3, c0 // 2, 3, 2), CBA(c0 // 2, c0 // 2, 3), CBA(c0 // 2, c0, 3))
        for i, (ci, co, n, residual, spp) in enumerate(_STAGES, start=1):
            ci, co = int(ci * w), int(co * w)
            layers: list[nn.Module] = [CBA(ci, co, 3, 2)]
            if spp:
                layers.append(SPPF(co, co))
            layers.append(NeXtCSP(co, co, _depth(n, cfg.deepen), residual, attention=True))
            setattr(self, f"stage{i}", nn.Sequential(*layers))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.stage2(self.stage1(self.stem(x)))
        c4 = self.stage3(x)
        return x, c4, self.stage4(c4)


class PAFPN(nn.Module):
    """CSPNeXt PAFPN: top-down (reduce, upsample, CSP) then bottom-up, 3x3 output convs."""

    def __init__(self, chans: tuple[int, int, int], c_out: int, n: int):
        super().__init__()
        c3, c4, c5 = chans
        self.reduce_layers = nn.ModuleList([CBA(c5, c4, 1), CBA(c4, c3, 1)])
        self.top_down_blocks = nn.ModuleList([NeXtCSP(2 * c4, c4, n, False, False),
                                              NeXtCSP(2 * c3, c3, n, False, False)])
        self.downsamples = nn.ModuleList([CBA(c3, c3, 3, 2), CBA(c4, c4, 3, 2)])
        self.bottom_up_blocks = nn.ModuleList([NeXtCSP(2 * c3, c4, n, False, False),
                                               NeXtCSP(2 * c4, c5, n, False, False)])
        self.out_convs = nn.ModuleList([CBA(c, c_out, 3) for c in chans])
        self.up = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, c3: torch.Tensor, c4: torch.Tensor, c5: torch.Tensor) -> list[torch.Tensor]:
        r5 = self.reduce_layers[0](c5)
        t4 = self.top_down_blocks[0](torch.cat((self.up(r5), c4), 1))
        r4 = self.reduce_layers[1](t4)
        p3 = self.top_down_blocks[1](torch.cat((self.up(r4), c3), 1))
        p4 = self.bottom_up_blocks[0](torch.cat((self.downsamples[0](p3), r4), 1))
        p5 = self.bottom_up_blocks[1](torch.cat((self.downsamples[1](p4), r5), 1))
        return [conv(p) for conv, p in zip(self.out_convs, (p3, p4, p5))]


class SepBNHead(nn.Module):
    """Per-level class and box towers whose convolutions are shared across levels.

    Only the convolution weights are shared (the ``tied`` entries of the checkpoint); each
    level keeps its own BatchNorm and its own 1x1 prediction convs.
    """

    def __init__(self, nc: int, c: int, exp_on_reg: bool, stacked: int = 2):
        super().__init__()
        self.nc = nc
        self.exp_on_reg = exp_on_reg
        self.cls_convs = nn.ModuleList()
        self.reg_convs = nn.ModuleList()
        for _ in STRIDES:
            self.cls_convs.append(nn.Sequential(*[CBA(c, c, 3) for _ in range(stacked)]))
            self.reg_convs.append(nn.Sequential(*[CBA(c, c, 3) for _ in range(stacked)]))
        for towers in (self.cls_convs, self.reg_convs):
            for level in towers[1:]:
                for j, layer in enumerate(level):
                    layer.conv = towers[0][j].conv
        self.rtm_cls = nn.ModuleList([nn.Conv2d(c, nc, 1) for _ in STRIDES])
        self.rtm_reg = nn.ModuleList([nn.Conv2d(c, 4, 1) for _ in STRIDES])

    def forward(self, feats: list[torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        cls_out, box_out = [], []
        for i, (f, s) in enumerate(zip(feats, STRIDES)):
            cls_out.append(self.rtm_cls[i](self.cls_convs[i](f)))
            reg = self.rtm_reg[i](self.reg_convs[i](f))
            box_out.append((reg.exp() if self.exp_on_reg else reg) * s)
        return tuple(cls_out), tuple(box_out)


class RtmdetNet(nn.Module):
    """The whole detector; ``forward`` returns ``(cls_scores, bbox_preds)`` per level."""

    def __init__(self, size: str = "t", nc: int = 80):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown RTMDet size {size!r}; sizes: {', '.join(CONFIGS)}")
        cfg = CONFIGS[size]
        self.size, self.nc = size, nc
        w = cfg.widen
        chans = (int(256 * w), int(512 * w), int(1024 * w))
        self.backbone = CSPNeXt(cfg)
        self.neck = PAFPN(chans, int(256 * w), _depth(3, cfg.deepen))
        self.head = SepBNHead(nc, int(256 * w), cfg.exp_on_reg)

    def forward(self, x: torch.Tensor):
        return self.head(self.neck(*self.backbone(x)))

    def fuse(self) -> RtmdetNet:
        """Fold every BatchNorm (each head level gets its own folded copy of the shared conv)."""
        return fuse_modules(self)


# ---------------------------------------------------------------- instance segmentation (RTMDet-Ins)
#: dynamic mask head: 3 chained 1x1 convs on (prototypes + 2 relative-coordinate channels)
NUM_PROTOTYPES = 8
DYNAMIC_CHANNELS = 8
#: (in, out) of each dynamic conv; the kernel branch predicts their weights then their biases
DYNAMIC_CONVS = ((NUM_PROTOTYPES + 2, DYNAMIC_CHANNELS), (DYNAMIC_CHANNELS, DYNAMIC_CHANNELS), (DYNAMIC_CHANNELS, 1))
NUM_DYNAMIC_PARAMS = sum(i * o for i, o in DYNAMIC_CONVS) + sum(o for _, o in DYNAMIC_CONVS)   # 169


def resize_bilinear_cuda(x: torch.Tensor, size) -> torch.Tensor:
    """``F.interpolate(x, size, mode="bilinear")``. On CUDA through :func:`resize_bilinear` (the same
    forward; a backward without the atomic adds of torch's, so a captured training step equals eager
    bit for bit); on the CPU torch's own call, whose backward is already a sequential loop (keeping
    the CPU's training numbers unchanged)."""
    if x.is_cuda:
        return resize_bilinear(x, size)
    return nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)


def resize_bilinear_cuda_backward(grad: torch.Tensor, in_size: tuple[int, int]) -> torch.Tensor:
    """The input gradient of :func:`resize_bilinear_cuda` (from an (H, W) ``in_size`` to ``grad``'s
    last two dims, ``grad`` (B, C, h, w)), for custom backwards: on CUDA :func:`resize_bilinear`'s
    (no atomics), on the CPU torch's own kernel, the one autograd calls there."""
    if grad.is_cuda:
        return resize_bilinear_backward(grad, in_size)
    return torch.ops.aten.upsample_bilinear2d_backward(grad, list(grad.shape[-2:]), [*grad.shape[:-2], *in_size],
                                                       False, None, None)


class MaskFeatModule(nn.Module):
    """Mask prototypes at stride 8: the neck's three levels upsampled (bilinear) to the finest,
    concatenated, fused by a 1x1 conv (bias, no activation), ``stacked`` 3x3 ConvBN-SiLU blocks,
    then a 1x1 projection to :data:`NUM_PROTOTYPES` channels without activation."""

    def __init__(self, c: int, levels: int = 3, stacked: int = 4):
        super().__init__()
        self.fusion_conv = nn.Conv2d(levels * c, c, 1)
        self.stacked_convs = nn.Sequential(*[CBA(c, c, 3) for _ in range(stacked)])
        self.projection = nn.Conv2d(c, NUM_PROTOTYPES, 1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        size = feats[0].shape[-2:]
        up = [feats[0]] + [resize_bilinear_cuda(f, size) for f in feats[1:]]
        return self.projection(self.stacked_convs(self.fusion_conv(torch.cat(up, 1))))


class InsSepBNHead(nn.Module):
    """RTMDet-Ins head: class and box towers (one set of modules: the box branch reads the class
    tower's features, so ``reg_convs`` is ``cls_convs`` and the checkpoint ties their entries),
    3x3 convs shared across levels with a BatchNorm per level; a kernel tower per level predicting
    each location's dynamic-conv parameters; and the prototype module on the neck's outputs.

    Boxes are ``relu(raw) * stride`` (left, top, right, bottom distances in input pixels) for
    every size: the Ins head never takes an exponential.
    """

    def __init__(self, nc: int, c: int, stacked: int = 2):
        super().__init__()
        self.nc = nc
        self.cls_convs = nn.ModuleList([nn.Sequential(*[CBA(c, c, 3) for _ in range(stacked)]) for _ in STRIDES])
        for level in self.cls_convs[1:]:
            for j, layer in enumerate(level):
                layer.conv = self.cls_convs[0][j].conv
        self.reg_convs = self.cls_convs
        self.kernel_convs = nn.ModuleList([nn.Sequential(*[CBA(c, c, 3) for _ in range(stacked)])
                                           for _ in STRIDES])
        self.rtm_cls = nn.ModuleList([nn.Conv2d(c, nc, 1) for _ in STRIDES])
        self.rtm_reg = nn.ModuleList([nn.Conv2d(c, 4, 1) for _ in STRIDES])
        self.rtm_kernel = nn.ModuleList([nn.Conv2d(c, NUM_DYNAMIC_PARAMS, 1) for _ in STRIDES])
        self.mask_head = MaskFeatModule(c, len(STRIDES))

    def forward(self, feats: list[torch.Tensor]):
        cls_out, box_out, kernel_out = [], [], []
        for i, (f, s) in enumerate(zip(feats, STRIDES)):
            t = self.cls_convs[i](f)
            cls_out.append(self.rtm_cls[i](t))
            box_out.append(torch.relu(self.rtm_reg[i](t)) * s)
            kernel_out.append(self.rtm_kernel[i](self.kernel_convs[i](f)))
        return tuple(cls_out), tuple(box_out), tuple(kernel_out), self.mask_head(feats)


class RtmdetInsNet(RtmdetNet):
    """RTMDet-Ins: the detector's backbone and neck with :class:`InsSepBNHead`; ``forward``
    returns ``(cls_scores, bbox_preds, kernel_preds, mask_feat)``: per level the class logits,
    the box distances and the (B, 169, H/s, W/s) dynamic-conv parameters, and the (B, 8, H/8,
    W/8) prototypes."""

    def __init__(self, size: str = "t", nc: int = 80):
        super().__init__(size, nc)
        self.head = InsSepBNHead(nc, int(256 * CONFIGS[size].widen))


def dynamic_masks(protos: torch.Tensor, params: torch.Tensor, points: torch.Tensor, strides: torch.Tensor,
                  proto_stride: int) -> torch.Tensor:
    """Mask logits of chosen anchors: their dynamic 1x1 convs (ReLU between) on the prototypes
    with two relative-coordinate channels in front.

    ``protos`` (..., P, h, w), ``params`` (..., n, 169), ``points`` (..., n, 2) the anchors' prior
    points (x, y) in input pixels, ``strides`` (..., n) their strides -> (..., n, h, w). The
    coordinates are (anchor point - prototype pixel's point) / (anchor stride * 8), the
    prototype pixel (col, row) at (col * proto_stride, row * proto_stride). Batched matrix
    products, equal to the grouped convolutions of the original.
    """
    h, w = protos.shape[-2:]
    ys = torch.arange(h, device=protos.device, dtype=protos.dtype) * proto_stride
    xs = torch.arange(w, device=protos.device, dtype=protos.dtype) * proto_stride
    coord = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).reshape(1, h * w, 2)   # (1, hw, 2) x, y
    rel = (points.unsqueeze(-2) - coord) / (strides[..., None, None] * 8)                  # (..., n, hw, 2)
    n = params.shape[-2]
    flat = protos.flatten(-2).unsqueeze(-3).expand(*params.shape[:-1], -1, -1)           # (..., n, P, hw)
    x = torch.cat((rel.transpose(-1, -2), flat), -2)                                      # (..., n, P + 2, hw)
    at = sum(ci * co for ci, co in DYNAMIC_CONVS)
    wat, bat = 0, at
    for i, (ci, co) in enumerate(DYNAMIC_CONVS):
        wgt = params[..., wat:wat + ci * co].reshape(*params.shape[:-1], co, ci)
        bias = params[..., bat:bat + co].unsqueeze(-1)
        wat, bat = wat + ci * co, bat + co
        x = wgt @ x + bias
        if i < len(DYNAMIC_CONVS) - 1:
            x = torch.relu(x)
    return x.reshape(*params.shape[:-2], n, h, w)


def dynamic_masks_batched(protos: torch.Tensor, params: torch.Tensor, points: torch.Tensor, strides: torch.Tensor,
                          proto_stride: int) -> torch.Tensor:
    """:func:`dynamic_masks` for a batch (the training loss's many anchors per image), with less
    memory traffic: ``protos`` (B, 8, h, w), ``params`` (B, n, 169), ``points`` (B, n, 2),
    ``strides`` (B, n) -> (B, n, h, w).

    The first conv is linear in the relative coordinates, ``W_c (point - pixel) / (8 s)``, so it
    is split into a per-anchor bias ``W_c point / (8 s)`` and ``-W_c / (8 s)`` times the pixel
    coordinates, which every anchor of an image shares with the prototypes: one product of all
    the image's anchors' first-conv weights and biases (B, n * 8, 11) with (B, 11, h * w) (pixel
    x, y, the prototypes, ones), instead of an (n, 10, h * w) input per anchor. The other biases
    are added by ``baddbmm``, the ReLUs applied in place. The same function as
    :func:`dynamic_masks` up to float rounding (the split coordinate term is rounded differently
    from ``point - pixel``, the first bias is summed inside the product); predict keeps
    :func:`dynamic_masks`. With TF32 matmuls switched on (``torch.backends.cuda.matmul``; off by
    default) the two split terms, each up to the coordinates over ``8 s`` times the weights, are
    rounded to TF32 before they cancel, where ``dynamic_masks`` rounds their small difference.
    """
    b, n, _ = params.shape
    h, w = protos.shape[-2:]
    (ci, co), rest = DYNAMIC_CONVS[0], DYNAMIC_CONVS[1:]
    ys = torch.arange(h, device=protos.device, dtype=protos.dtype) * proto_stride
    xs = torch.arange(w, device=protos.device, dtype=protos.dtype) * proto_stride
    coord = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), 0).reshape(1, 2, h * w)     # (1, 2, hw) x, y
    ones = protos.new_ones(1, 1, h * w)
    rhs = torch.cat((coord.expand(b, -1, -1), protos.flatten(-2), ones.expand(b, -1, -1)), 1)   # (B, 11, hw)
    at = sum(i * o for i, o in DYNAMIC_CONVS)
    w1 = params[..., :ci * co].reshape(b, n, co, ci)
    wc = w1[..., :2] / (strides[..., None, None] * 8)                                      # (B, n, co, 2)
    bias = params[..., at:at + co] + (wc @ points.unsqueeze(-1)).squeeze(-1)               # (B, n, co)
    lhs = torch.cat((-wc, w1[..., 2:], bias.unsqueeze(-1)), -1).reshape(b, n * co, ci + 1)
    x = torch.bmm(lhs, rhs).relu_().view(b * n, co, h * w)
    wat, bat = ci * co, at + co
    for i, (ci, co) in enumerate(rest):
        wgt = params[..., wat:wat + ci * co].reshape(b * n, co, ci)
        bias = params[..., bat:bat + co].reshape(b * n, co, 1)
        wat, bat = wat + ci * co, bat + co
        x = torch.baddbmm(bias, wgt, x)
        if i < len(rest) - 1:
            x = x.relu_()
    return x.view(b, n, h, w)
