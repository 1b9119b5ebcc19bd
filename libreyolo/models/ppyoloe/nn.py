"""PP-YOLOE network (PaddleDetection's PP-YOLOE) in the LibreYOLO checkpoint layout.

Layout: ``backbone.*`` (CSPResNet: a three-conv stem, four CSP stages of RepVGG basic blocks with
an effective-SE gate), ``neck.*`` (CustomCSPPAN: top-down ``fpn_stages`` / ``fpn_routes`` with
an SPP in the first stage, bottom-up ``pan_stages`` / ``pan_routes``) and ``head.*`` (ET-head:
per-level ESE attention ``stem_cls`` / ``stem_reg`` and 3x3 ``pred_cls`` / ``pred_reg`` convs,
4 x 17 distribution bins). Sizes s, m, l, x scale PP-YOLOE's base widths and depths by
(0.50, 0.33), (0.75, 0.67), (1.0, 1.0) and (1.25, 1.33); SiLU activations throughout.

Levels run coarse to fine (strides 32, 16, 8). Train mode returns the raw tuple ``(cls_logits
(B, N, nc), reg_logits (B, N, 68), anchors (N, 4), anchor_points (N, 2), num_anchors per level,
stride_tensor (N, 1))``; eval mode returns ``((boxes (B, N, 4) xyxy in input pixels, scores
(B, N, nc) sigmoid), raw)``.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common.assign import cached
from ..common.blocks import fold_bn

STRIDES = (32, 16, 8)
REG_MAX = 16              # distances take bins 0..REG_MAX (REG_MAX + 1 bins per side)
GRID_CELL_SCALE = 5.0
GRID_CELL_OFFSET = 0.5
BN_EPS = 1e-5
BN_MOMENTUM = 0.1


@dataclass(frozen=True)
class PPYoloEConfig:
    width: float
    depth: float


CONFIGS: dict[str, PPYoloEConfig] = {
    "s": PPYoloEConfig(0.50, 0.33),
    "m": PPYoloEConfig(0.75, 0.67),
    "l": PPYoloEConfig(1.00, 1.00),
    "x": PPYoloEConfig(1.25, 1.33),
}
BACKBONE_CHANNELS = (64, 128, 256, 512, 1024)
BACKBONE_LAYERS = (3, 6, 6, 3)
NECK_CHANNELS = (768, 384, 192)
NECK_BLOCKS = 3


def _scaled(v: float, mult: float) -> int:
    return max(round(v * mult), 1)


class ConvBNLayer(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU (or identity), held as ``seq.conv`` / ``seq.bn``."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, act: bool = True):
        super().__init__()
        self.seq = nn.Sequential(OrderedDict([
            ("conv", nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False)),
            ("bn", nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)),
            ("act", nn.SiLU() if act else nn.Identity())]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(x)

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm into the convolution (inference only)."""
        if not isinstance(self.seq.bn, nn.BatchNorm2d):
            return
        old = self.seq.conv
        w, b = fold_bn(old.weight, None, self.seq.bn)
        conv = nn.Conv2d(old.in_channels, old.out_channels, old.kernel_size, old.stride, old.padding,
                         bias=True).to(w.device, w.dtype)
        conv.weight.copy_(w)
        conv.bias.copy_(b)
        conv.requires_grad_(False)
        self.seq.conv = conv
        self.seq.bn = nn.Identity()


class ConvBN(nn.Module):
    """A RepVGG branch: Conv2d (no bias) -> BatchNorm2d, no activation."""

    def __init__(self, c_in: int, c_out: int, k: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, 1, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class RepVggBlock(nn.Module):
    """SiLU(3x3 ConvBN + 1x1 ConvBN); re-parameterizable into one 3x3 conv."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.branch_3x3 = ConvBN(c_in, c_out, 3)
        self.branch_1x1 = ConvBN(c_in, c_out, 1)
        self.act = nn.SiLU()
        self.conv: nn.Conv2d | None = None   # set by fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv is not None:
            return self.act(self.conv(x))
        return self.act(self.branch_3x3(x) + self.branch_1x1(x))

    @torch.no_grad()
    def fuse(self) -> None:
        if self.conv is not None:
            return
        w3, b3 = fold_bn(self.branch_3x3.conv.weight, None, self.branch_3x3.bn)
        w1, b1 = fold_bn(self.branch_1x1.conv.weight, None, self.branch_1x1.bn)
        conv = nn.Conv2d(w3.shape[1], w3.shape[0], 3, 1, 1, bias=True).to(w3.device, w3.dtype)
        conv.weight.copy_(w3 + F.pad(w1, [1, 1, 1, 1]))
        conv.bias.copy_(b3 + b1)
        conv.requires_grad_(False)
        del self.branch_3x3, self.branch_1x1
        self.conv = conv


class BasicBlock(nn.Module):
    """3x3 ConvBNLayer -> RepVGG block, with the input added back when ``shortcut``."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True):
        super().__init__()
        self.conv1 = ConvBNLayer(c_in, c_out, 3)
        self.conv2 = RepVggBlock(c_out, c_out)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.shortcut else y


class EffectiveSE(nn.Module):
    """x * hardsigmoid(project(mean over H, W of x))."""

    def __init__(self, c: int):
        super().__init__()
        self.project = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * F.hardsigmoid(self.project(x.mean((2, 3), keepdim=True)))


class CSPResStage(nn.Module):
    """Backbone stage: 3x3 stride-2 down conv, then a CSP split whose second half runs ``n`` basic
    blocks, the halves joined, gated by effective SE and projected by a 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, n: int):
        super().__init__()
        mid = (c_in + c_out) // 2
        self.conv_down = ConvBNLayer(c_in, mid, 3, 2)
        self.conv1 = ConvBNLayer(mid, mid // 2, 1)
        self.conv2 = ConvBNLayer(mid, mid // 2, 1)
        self.blocks = nn.Sequential(*[BasicBlock(mid // 2, mid // 2, shortcut=True) for _ in range(n)])
        self.attn = EffectiveSE(mid)
        self.conv3 = ConvBNLayer(mid, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_down(x)
        y = torch.cat((self.conv1(x), self.blocks(self.conv2(x))), 1)
        return self.conv3(self.attn(y))


class CSPResNet(nn.Module):
    """Stem (3x3 s2, 3x3, 3x3) and four CSPRes stages; returns the stride 8, 16, 32 outputs."""

    def __init__(self, cfg: PPYoloEConfig):
        super().__init__()
        ch = [_scaled(c, cfg.width) for c in BACKBONE_CHANNELS]
        layers = [_scaled(n, cfg.depth) for n in BACKBONE_LAYERS]
        self.stem = nn.Sequential(OrderedDict([
            ("conv1", ConvBNLayer(3, ch[0] // 2, 3, 2)),
            ("conv2", ConvBNLayer(ch[0] // 2, ch[0] // 2, 3, 1)),
            ("conv3", ConvBNLayer(ch[0] // 2, ch[0], 3, 1))]))
        self.stages = nn.ModuleList(CSPResStage(ch[i], ch[i + 1], layers[i]) for i in range(4))
        self.out_channels = tuple(ch[2:])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i >= 1:
                outs.append(x)
        return outs


class SPP(nn.Module):
    """Concatenate x with its 5, 9 and 13 max pools (stride 1), then a ConvBNLayer."""

    def __init__(self, c_in: int, c_out: int, pools: tuple[int, ...] = (5, 9, 13)):
        super().__init__()
        self.pools = pools
        self.conv = ConvBNLayer(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([x, *(F.max_pool2d(x, k, 1, k // 2) for k in self.pools)], 1))


class CSPStage(nn.Module):
    """Neck CSP stage: two 1x1 halves, ``n`` basic blocks (no shortcut) on the second, an SPP after
    the middle block when ``spp``, the halves joined by a 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, n: int, spp: bool = False):
        super().__init__()
        mid = c_out // 2
        self.conv1 = ConvBNLayer(c_in, mid, 1)
        self.conv2 = ConvBNLayer(c_in, mid, 1)
        convs: list[tuple[str, nn.Module]] = []
        for i in range(n):
            convs.append((str(i), BasicBlock(mid, mid, shortcut=False)))
            if spp and i == (n - 1) // 2:
                convs.append(("spp", SPP(mid * 4, mid)))
        self.convs = nn.Sequential(OrderedDict(convs))
        self.conv3 = ConvBNLayer(mid * 2, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat((self.conv1(x), self.convs(self.conv2(x))), 1))


class CustomCSPPAN(nn.Module):
    """Top-down FPN then bottom-up PAN over the backbone's three levels; returns coarse to fine."""

    def __init__(self, in_channels: tuple[int, ...], cfg: PPYoloEConfig):
        super().__init__()
        out = [_scaled(c, cfg.width) for c in NECK_CHANNELS]
        n = _scaled(NECK_BLOCKS, cfg.depth)
        self.fpn_stages = nn.ModuleList()
        self.fpn_routes = nn.ModuleList()
        prev = 0
        for i, (c_in, c_out) in enumerate(zip(in_channels[::-1], out)):
            c_in = c_in + prev // 2 if i > 0 else c_in
            self.fpn_stages.append(nn.Sequential(CSPStage(c_in, c_out, n, spp=i == 0)))
            if i < len(out) - 1:
                self.fpn_routes.append(ConvBNLayer(c_out, c_out // 2, 1))
            prev = c_out
        pan_stages, pan_routes = [], []
        for i in reversed(range(len(out) - 1)):
            pan_routes.append(ConvBNLayer(out[i + 1], out[i + 1], 3, 2))
            pan_stages.append(nn.Sequential(CSPStage(out[i] + out[i + 1], out[i], n)))
        self.pan_stages = nn.ModuleList(pan_stages[::-1])
        self.pan_routes = nn.ModuleList(pan_routes[::-1])
        self.out_channels = tuple(out)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        fpn = []
        route = None
        for i, block in enumerate(feats[::-1]):
            if route is not None:
                block = torch.cat((route, block), 1)
            route = self.fpn_stages[i](block)
            fpn.append(route)
            if i < len(self.fpn_routes):
                route = F.interpolate(self.fpn_routes[i](route), scale_factor=2.0, mode="nearest")
        pan = [fpn[-1]]
        route = fpn[-1]
        for i in reversed(range(len(self.pan_routes))):
            route = self.pan_stages[i](torch.cat((self.pan_routes[i](route), fpn[i]), 1))
            pan.append(route)
        return pan[::-1]


class ESEAttn(nn.Module):
    """ConvBNLayer(x * sigmoid(fc(pooled x))): the head's per-level channel attention."""

    def __init__(self, c: int):
        super().__init__()
        self.fc = nn.Conv2d(c, c, 1)
        self.conv = ConvBNLayer(c, c, 1)

    def forward(self, x: torch.Tensor, avg: torch.Tensor) -> torch.Tensor:
        return self.conv(x * self.fc(avg).sigmoid())


class PPYoloEHead(nn.Module):
    """ET-head: class logits from ``pred_cls(stem_cls(x) + x)``, 4 x 17 distribution logits from
    ``pred_reg(stem_reg(x))``, per level (coarse to fine)."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int = REG_MAX):
        super().__init__()
        self.nc, self.reg_max = nc, reg_max
        self.stem_cls = nn.ModuleList(ESEAttn(c) for c in channels)
        self.stem_reg = nn.ModuleList(ESEAttn(c) for c in channels)
        self.pred_cls = nn.ModuleList(nn.Conv2d(c, nc, 3, padding=1) for c in channels)
        self.pred_reg = nn.ModuleList(nn.Conv2d(c, 4 * (reg_max + 1), 3, padding=1) for c in channels)
        self.register_buffer("proj", torch.arange(reg_max + 1, dtype=torch.float32), persistent=False)
        self._grid_cache: dict = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PP-YOLOE's head initialisation: zero prediction weights, class bias at a 1 % prior,
        box bias 1 (flat distributions); the attention fc weights drawn with std 0.001."""
        prior = -math.log((1 - 0.01) / 0.01)
        for stem in (*self.stem_cls, *self.stem_reg):
            nn.init.normal_(stem.fc.weight, std=0.001)
            nn.init.zeros_(stem.fc.bias)
        for cls, reg in zip(self.pred_cls, self.pred_reg):
            nn.init.zeros_(cls.weight)
            nn.init.constant_(cls.bias, prior)
            nn.init.zeros_(reg.weight)
            nn.init.constant_(reg.bias, 1.0)

    def anchors(self, hws: tuple[tuple[int, int], ...], dtype: torch.dtype, device: torch.device):
        """(anchors (N, 4) cell boxes in pixels, anchor_points (N, 2) centres in pixels, stride
        (N, 1)), coarse level first; cached per shape."""
        def build():
            boxes, points, strides = [], [], []
            for (h, w), s in zip(hws, STRIDES):
                half = GRID_CELL_SCALE * s * 0.5
                ys = (torch.arange(h, dtype=dtype, device=device) + GRID_CELL_OFFSET) * s
                xs = (torch.arange(w, dtype=dtype, device=device) + GRID_CELL_OFFSET) * s
                gy, gx = torch.meshgrid(ys, xs, indexing="ij")
                gx, gy = gx.reshape(-1), gy.reshape(-1)
                boxes.append(torch.stack((gx - half, gy - half, gx + half, gy + half), -1))
                points.append(torch.stack((gx, gy), -1))
                strides.append(torch.full((h * w, 1), float(s), dtype=dtype, device=device))
            return torch.cat(boxes), torch.cat(points), torch.cat(strides)
        return cached(self._grid_cache, (hws, dtype, device), build)

    def forward(self, feats: list[torch.Tensor]):
        """Raw tuple (see the module docstring)."""
        cls_out, reg_out = [], []
        for i, x in enumerate(feats):
            avg = x.mean((2, 3), keepdim=True)
            cls_out.append(self.pred_cls[i](self.stem_cls[i](x, avg) + x).flatten(2))
            reg_out.append(self.pred_reg[i](self.stem_reg[i](x, avg)).flatten(2))
        cls_logits = torch.cat(cls_out, 2).transpose(1, 2)
        reg_logits = torch.cat(reg_out, 2).transpose(1, 2)
        hws = tuple(tuple(x.shape[-2:]) for x in feats)   # not int(): an ONNX trace keeps them symbolic
        anchors, points, strides = self.anchors(hws, cls_logits.dtype, cls_logits.device)
        counts = [h * w for h, w in hws]
        return cls_logits, reg_logits, anchors, points, counts, strides

    def decode(self, cls_logits: torch.Tensor, reg_logits: torch.Tensor, points: torch.Tensor,
               strides: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> boxes (B, N, 4) xyxy in input pixels, scores (B, N, nc)."""
        b, n, _ = reg_logits.shape
        prob = reg_logits.reshape(b, n, 4, self.reg_max + 1).softmax(-1)
        dist = (prob * self.proj.to(prob.dtype)).sum(-1)
        centres = points / strides
        lt, rb = dist.split(2, -1)
        boxes = torch.cat((centres - lt, centres + rb), -1) * strides
        return boxes, cls_logits.sigmoid()


class PPYoloENet(nn.Module):
    """The whole PP-YOLOE network for one size."""

    def __init__(self, size: str = "s", nc: int = 80):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown ppyoloe size {size!r}; choose one of {sorted(CONFIGS)}")
        cfg = CONFIGS[size]
        self.size, self.nc = size, nc
        self.backbone = CSPResNet(cfg)
        self.neck = CustomCSPPAN(self.backbone.out_channels, cfg)
        self.head = PPYoloEHead(nc, self.neck.out_channels)
        self.stride = STRIDES

    def forward(self, x: torch.Tensor):
        raw = self.head(self.neck(self.backbone(x)))
        if self.training:
            return raw
        cls_logits, reg_logits, _, points, _, strides = raw
        return self.head.decode(cls_logits, reg_logits, points, strides), raw

    def fuse(self) -> PPYoloENet:
        """Fold every BatchNorm and re-parameterize every RepVGG block (inference only)."""
        for m in list(self.modules()):
            if isinstance(m, RepVggBlock):
                m.fuse()
        for m in list(self.modules()):
            if isinstance(m, ConvBNLayer):
                m.fuse()
        return self
