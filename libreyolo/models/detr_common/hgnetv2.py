"""HGNetv2: the CNN backbone of the D-FINE line (D-FINE, DEIM, RT-DETRv4).

Layout (attribute names are checkpoint keys): ``stem.{stem1, stem2a, stem2b, stem3, stem4}`` and
``stages.<i>.{downsample, blocks.<j>.{layers.<k>, aggregation.{0,1}}}``. Every conv unit is
``conv`` -> ``bn`` -> ReLU -> ``lab`` (a learnable scalar affine, present only where the variant
uses it and the unit has an activation). Stage ``i`` halves the resolution (except the first);
the outputs of the stages in ``return_idx`` are returned (strides 4, 8, 16, 32 for stages 0..3).

Large variants train with frozen BatchNorm; :class:`FrozenBatchNorm2d` keeps the same four
tensors as buffers but has no ``num_batches_tracked``, which is what their checkpoints hold.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .layers import activation, fold_conv_bn


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics and affine terms (all four are buffers, eps 1e-5)."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


def freeze_norms(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm2d below ``module`` by a :class:`FrozenBatchNorm2d` (in place)."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, FrozenBatchNorm2d(child.num_features, child.eps))
        else:
            freeze_norms(child)
    return module


class LearnableAffine(nn.Module):
    """y = scale * x + bias with two learnable scalars (HGNetv2's "lab")."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x + self.bias


class ConvBNAct(nn.Module):
    """Conv (no bias, 'same' padding for odd k) -> BN -> activation -> optional affine."""

    def __init__(self, c_in: int, c_out: int, k: int, s: int = 1, groups: int = 1,
                 act: str | None = "relu", lab: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, (k - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = activation(act)
        self.lab = LearnableAffine() if (act is not None and lab) else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x) if self.bn is None else self.bn(self.conv(x))
        return self.lab(self.act(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the (possibly frozen) BatchNorm into the convolution."""
        if self.bn is not None:
            self.conv = fold_conv_bn(self.conv, self.bn)
            self.bn = None


class LightConvBNAct(nn.Module):
    """1x1 ConvBN (no activation) then a depthwise k x k ConvBNAct."""

    def __init__(self, c_in: int, c_out: int, k: int, act: str, lab: bool):
        super().__init__()
        self.conv1 = ConvBNAct(c_in, c_out, 1, act=None, lab=lab)
        self.conv2 = ConvBNAct(c_out, c_out, k, groups=c_out, act=act, lab=lab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class StemBlock(nn.Module):
    """Stride-4 stem: 3x3/2, a 2x2 conv pair in parallel with a 2x2 max-pool, 3x3/2, 1x1."""

    def __init__(self, c_in: int, c_mid: int, c_out: int, act: str, lab: bool):
        super().__init__()
        self.stem1 = ConvBNAct(c_in, c_mid, 3, 2, act=act, lab=lab)
        self.stem2a = ConvBNAct(c_mid, c_mid // 2, 2, act=act, lab=lab)
        self.stem2b = ConvBNAct(c_mid // 2, c_mid, 2, act=act, lab=lab)
        self.stem3 = ConvBNAct(c_mid * 2, c_mid, 3, 2, act=act, lab=lab)
        self.stem4 = ConvBNAct(c_mid, c_out, 1, act=act, lab=lab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(self.stem1(x), (0, 1, 0, 1))        # right/bottom pad keeps 2x2 ops size-preserving
        branch = self.stem2b(F.pad(self.stem2a(x), (0, 1, 0, 1)))
        pooled = F.max_pool2d(x, 2, 1, 0, 1, True)     # 2x2, stride 1, ceil mode
        return self.stem4(self.stem3(torch.cat([pooled, branch], 1)))


class HGBlock(nn.Module):
    """``layer_num`` chained conv units, all outputs (and the input) concatenated, then aggregated.

    Aggregation: 1x1 squeeze to out/2 then 1x1 excitation to out. Residual for all but a
    stage's first block.
    """

    def __init__(self, c_in: int, c_mid: int, c_out: int, layer_num: int, k: int, residual: bool,
                 light: bool, act: str, lab: bool):
        super().__init__()
        self.residual = residual
        self.layers = nn.ModuleList(
            LightConvBNAct(c_in if i == 0 else c_mid, c_mid, k, act, lab) if light
            else ConvBNAct(c_in if i == 0 else c_mid, c_mid, k, act=act, lab=lab)
            for i in range(layer_num))
        total = c_in + layer_num * c_mid
        self.aggregation = nn.Sequential(ConvBNAct(total, c_out // 2, 1, act=act, lab=lab),
                                         ConvBNAct(c_out // 2, c_out, 1, act=act, lab=lab))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [x]
        y = x
        for layer in self.layers:
            y = layer(y)
            outs.append(y)
        y = self.aggregation(torch.cat(outs, 1))
        return y + x if self.residual else y


class HGStage(nn.Module):
    """Optional depthwise 3x3/2 downsample (no activation) followed by ``block_num`` HG blocks."""

    def __init__(self, c_in: int, c_mid: int, c_out: int, block_num: int, layer_num: int,
                 downsample: bool, light: bool, k: int, act: str, lab: bool):
        super().__init__()
        self.downsample = (ConvBNAct(c_in, c_in, 3, 2, groups=c_in, act=None, lab=lab)
                           if downsample else nn.Identity())
        self.blocks = nn.Sequential(*[
            HGBlock(c_in if i == 0 else c_out, c_mid, c_out, layer_num, k, i != 0, light, act, lab)
            for i in range(block_num)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


@dataclass(frozen=True)
class StageSpec:
    c_in: int
    c_mid: int
    c_out: int
    blocks: int
    downsample: bool
    light: bool
    kernel: int
    layers: int


def _stages(*rows: tuple) -> tuple[StageSpec, ...]:
    return tuple(StageSpec(*r) for r in rows)


#: variant -> (stem channels (in, mid, out), stage specs), as published for HGNetv2 (B0-B6) and DEIMv2
HGNETV2_ARCHS: dict[str, tuple[tuple[int, int, int], tuple[StageSpec, ...]]] = {
    # the three-stage variants of DEIMv2's smallest sizes (atto, femto, pico): stride 16 at most
    "Atto": ((3, 16, 16), _stages((16, 16, 64, 1, False, False, 3, 3), (64, 32, 256, 1, True, False, 3, 3),
                                  (256, 64, 256, 1, True, True, 3, 3))),
    "Femto": ((3, 16, 16), _stages((16, 16, 64, 1, False, False, 3, 3), (64, 32, 256, 1, True, False, 3, 3),
                                   (256, 64, 512, 1, True, True, 5, 3))),
    "Pico": ((3, 16, 16), _stages((16, 16, 64, 1, False, False, 3, 3), (64, 32, 256, 1, True, False, 3, 3),
                                  (256, 64, 512, 2, True, True, 5, 3))),
    "B0": ((3, 16, 16), _stages((16, 16, 64, 1, False, False, 3, 3), (64, 32, 256, 1, True, False, 3, 3),
                                (256, 64, 512, 2, True, True, 5, 3), (512, 128, 1024, 1, True, True, 5, 3))),
    "B1": ((3, 24, 32), _stages((32, 32, 64, 1, False, False, 3, 3), (64, 48, 256, 1, True, False, 3, 3),
                                (256, 96, 512, 2, True, True, 5, 3), (512, 192, 1024, 1, True, True, 5, 3))),
    "B2": ((3, 24, 32), _stages((32, 32, 96, 1, False, False, 3, 4), (96, 64, 384, 1, True, False, 3, 4),
                                (384, 128, 768, 3, True, True, 5, 4), (768, 256, 1536, 1, True, True, 5, 4))),
    "B3": ((3, 24, 32), _stages((32, 32, 128, 1, False, False, 3, 5), (128, 64, 512, 1, True, False, 3, 5),
                                (512, 128, 1024, 3, True, True, 5, 5), (1024, 256, 2048, 1, True, True, 5, 5))),
    "B4": ((3, 32, 48), _stages((48, 48, 128, 1, False, False, 3, 6), (128, 96, 512, 1, True, False, 3, 6),
                                (512, 192, 1024, 3, True, True, 5, 6), (1024, 384, 2048, 1, True, True, 5, 6))),
    "B5": ((3, 32, 64), _stages((64, 64, 128, 1, False, False, 3, 6), (128, 128, 512, 2, True, False, 3, 6),
                                (512, 256, 1024, 5, True, True, 5, 6), (1024, 512, 2048, 2, True, True, 5, 6))),
    "B6": ((3, 48, 96), _stages((96, 96, 192, 2, False, False, 3, 6), (192, 192, 512, 3, True, False, 3, 6),
                                (512, 384, 1024, 6, True, True, 5, 6), (1024, 768, 2048, 3, True, True, 5, 6))),
}


class HGNetv2(nn.Module):
    """HGNetv2 backbone returning the feature maps of the stages in ``return_idx``.

    ``use_lab`` adds the learnable affine after each activation (the small variants);
    ``frozen_norm`` swaps every BatchNorm for :class:`FrozenBatchNorm2d` (checkpoint layout
    of the variants trained with frozen statistics); ``act`` is ReLU in every published config.
    """

    def __init__(self, name: str, use_lab: bool = False, return_idx: tuple[int, ...] = (1, 2, 3),
                 frozen_norm: bool = False, act: str = "relu"):
        super().__init__()
        if name not in HGNETV2_ARCHS:
            raise ValueError(f"unknown HGNetv2 variant {name!r}; known: {', '.join(HGNETV2_ARCHS)}")
        stem, specs = HGNETV2_ARCHS[name]
        self.return_idx = tuple(return_idx)
        self.out_channels = [specs[i].c_out for i in self.return_idx]
        self.out_strides = [4 * 2 ** i for i in self.return_idx]
        self.stem = StemBlock(*stem, act=act, lab=use_lab)
        self.stages = nn.ModuleList(
            HGStage(s.c_in, s.c_mid, s.c_out, s.blocks, s.layers, s.downsample, s.light, s.kernel,
                    act, use_lab) for s in specs)
        if frozen_norm:
            freeze_norms(self)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.return_idx:
                outs.append(x)
        return outs
