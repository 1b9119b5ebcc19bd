"""PP-OCR networks: a DB text detector (``det``) and a CTC text recognizer (``rec``) in one module.

Layout follows the LibreYOLO checkpoints (size t pinned by the ``ppocr-t-det`` / ``ppocr-t-rec``
fixtures; the architecture is that of PP-OCRv5 mobile):

``det``: a PP-LCNetV3 backbone (width scale 0.75, detection strides), an RSE-FPN neck (96
channels) and a DB head whose eval output is the sigmoid shrink map at input resolution.
``rec``: a PP-LCNetV3 backbone (width scale 0.95, recognition strides: the height shrinks by 16
and the width by 4, then a 3x2 average pool gives one column per 8 input pixels), an SVTR
sequence encoder and a linear CTC classifier with a softmax in eval mode.

PP-LCNetV3 blocks: a depthwise then a pointwise *learnable re-parameterizable layer* - the sum
of four conv+BN branches, a 1x1 conv+BN branch (depthwise kxk layers only) and a BN identity
branch (equal widths, stride 1), scaled by a learnable affine (scale, bias scalars); then
hard-swish and another learnable affine, except after a stride-2 layer (whose output is left
linear, as PP-LCNetV3 does) - with a squeeze-excitation between the two in the SE blocks. The
stem is a stride-2 3x3 conv + BN without activation.

Every shape derives from the input's static size (no host syncs, no data-dependent shapes):
both networks are CUDA-graph safe.

:meth:`PPOCRNet.fuse` re-parameterizes for inference: each learnable re-parameterizable layer's
branches (BatchNorms folded, the 1x1 kernel and the identity placed at the kxk centre) and its
learnable affine are summed into one conv with bias - the transform PaddleOCR's inference
export applies - and every other conv + BatchNorm pair is folded; each conv followed by an
activation becomes a :class:`ConvAct`, which on the CPU (float32, no autograd, not tracing) runs
as one oneDNN primitive with the activation as a post-op - the output written once instead of
twice - and elsewhere as the conv then the activation in place. The fused network computes the
same function up to float32 rounding.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# (kernel, in, out, stride, use_se) per block, before width scaling (PP-LCNetV3's tables)
_DET_BLOCKS = {
    "blocks2": [(3, 16, 32, 1, False)],
    "blocks3": [(3, 32, 64, 2, False), (3, 64, 64, 1, False)],
    "blocks4": [(3, 64, 128, 2, False), (3, 128, 128, 1, False)],
    "blocks5": [(3, 128, 256, 2, False)] + [(5, 256, 256, 1, False)] * 4,
    "blocks6": [(5, 256, 512, 2, True), (5, 512, 512, 1, True), (5, 512, 512, 1, False), (5, 512, 512, 1, False)],
}
_REC_BLOCKS = {
    "blocks2": [(3, 16, 32, 1, False)],
    "blocks3": [(3, 32, 64, 1, False), (3, 64, 64, 1, False)],
    "blocks4": [(3, 64, 128, (2, 1), False), (3, 128, 128, 1, False)],
    "blocks5": [(3, 128, 256, (1, 2), False)] + [(5, 256, 256, 1, False)] * 4,
    "blocks6": [(5, 256, 512, (2, 1), True), (5, 512, 512, 1, True), (5, 512, 512, (2, 1), False),
                (5, 512, 512, 1, False)],
}
#: the detector's per-stage output widths after the 1x1 projections (``layer_list``), unscaled
_DET_PROJ = (16, 24, 56, 480)


def make_divisible(v: float, divisor: int = 16) -> int:
    """Round a scaled width to a multiple of ``divisor`` (never below it, never 10 % below ``v``)."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new < 0.9 * v:
        new += divisor
    return new


@dataclass(frozen=True)
class PPOCRConfig:
    det_scale: float = 0.75
    rec_scale: float = 0.95
    neck_channels: int = 96
    rec_dims: int = 120          # SVTR encoder width (hidden and output)
    rec_depth: int = 2
    rec_heads: int = 8
    num_classes: int = 18385     # CTC alphabet: blank + dictionary + space (PP-OCRv5's; a checkpoint's own alphabet may differ)
    branches: int = 4            # conv branches of each learnable re-parameterizable layer


CONFIGS = {"t": PPOCRConfig()}


class Affine(nn.Module):
    """``scale * x + bias`` with learnable scalars (PP-LCNetV3's learnable affine block)."""

    def __init__(self, scale: float = 1.0, bias: float = 0.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([scale]))
        self.bias = nn.Parameter(torch.tensor([bias]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x + self.bias


class ConvBN(nn.Module):
    """Conv (no bias, padding (k-1)//2) + BatchNorm, no activation."""

    def __init__(self, cin: int, cout: int, k: int, stride=1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) if self.bn is None else self.bn(self.conv(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm into the conv (a conv with bias)."""
        if self.bn is not None:
            self.conv, self.bn = fold_conv(self.conv, self.bn), None


def fold_conv(conv: Any, bn: Any) -> Any:
    """A new conv (with bias) equal to ``bn(conv(x))`` in eval mode; a transposed conv's output
    channels are its weight's second dimension."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    bias = (conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)) - bn.running_mean
    transposed = isinstance(conv, nn.ConvTranspose2d)
    extra = {"output_padding": conv.output_padding} if transposed else {}
    cls = nn.ConvTranspose2d if transposed else nn.Conv2d
    out = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
              groups=conv.groups, bias=True, dilation=conv.dilation, **extra).to(conv.weight)
    out.weight.copy_(conv.weight * (scale.view(1, -1, 1, 1) if transposed else scale.view(-1, 1, 1, 1)))
    out.bias.copy_(bias * scale + bn.bias)
    return out.requires_grad_(False)


_ONEDNN: dict[str, Any] = {}


def _onednn_ops() -> tuple[Any, Any] | None:
    """oneDNN's fused conv + activation operators (``torch.ops.mkldnn._convolution_pointwise`` and
    its transposed twin, the ones inductor emits for CPU convs) once a probe showed that they run
    and equal the conv then the activation; None where this torch build has no such operators."""
    if "ops" not in _ONEDNN:
        ops = None
        try:
            if torch.backends.mkldnn.is_available():
                conv = torch.ops.mkldnn._convolution_pointwise.default
                convt = torch.ops.mkldnn._convolution_transpose_pointwise.default
                g = torch.Generator().manual_seed(0)
                x, w, b = torch.randn(1, 4, 6, 6, generator=g), torch.randn(4, 4, 3, 3, generator=g), torch.randn(4)
                y = conv(x, w, b, [1, 1], [1, 1], [1, 1], 1, "hardswish", [], "")
                yt = convt(x, w[:, :, :2, :2].contiguous(), b, [0, 0], [0, 0], [2, 2], [1, 1], 1, "relu", [], "")
                if torch.allclose(y, F.hardswish(F.conv2d(x, w, b, padding=1)), atol=1e-5) and torch.allclose(
                        yt, F.relu(F.conv_transpose2d(x, w[:, :, :2, :2], b, 2)), atol=1e-5):
                    ops = (conv, convt)
        except (AttributeError, RuntimeError, NotImplementedError):
            ops = None
        _ONEDNN["ops"] = ops
    return _ONEDNN["ops"]


def _tracing() -> bool:
    """Inside torch.jit / FX / dynamo / ONNX-export tracing: only standard operators there."""
    fx = getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing", None)
    return bool(torch.jit.is_scripting() or torch.jit.is_tracing() or torch.compiler.is_compiling()
                or torch.onnx.is_in_onnx_export() or (fx is not None and fx()))


def _autograd(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an operation on these tensors (then no in-place or ``out=``)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


#: the activations a :class:`ConvAct` applies (oneDNN's post-op names) after a plain conv, in place
#: on its fresh output (``inplace`` False under autograd)
_ACTS = {"none": lambda y, inplace: y, "relu": lambda y, inplace: F.relu(y, inplace=inplace),
         "hardswish": lambda y, inplace: F.hardswish(y, inplace=inplace),
         "sigmoid": lambda y, inplace: y.sigmoid_() if inplace else y.sigmoid(),
         "swish": lambda y, inplace: F.silu(y, inplace=inplace)}


class ConvAct(nn.Module):
    """A conv (or transposed conv) with bias followed by an activation (``none``, ``relu``,
    ``hardswish``, ``sigmoid`` or ``swish`` = SiLU): the inference form :meth:`PPOCRNet.fuse`
    builds. On the CPU in float32 (no autograd, not tracing, oneDNN enabled) one oneDNN primitive
    with the activation as a post-op; elsewhere the conv, then the activation in place on its
    fresh output. Both compute the same values up to float32 rounding."""

    def __init__(self, conv: nn.Conv2d | nn.ConvTranspose2d, act: str):
        super().__init__()
        if act not in _ACTS:
            raise ValueError(f"ConvAct: unknown activation {act!r} (one of {', '.join(_ACTS)})")
        self.conv = conv
        self.act = act
        self.transposed = isinstance(conv, nn.ConvTranspose2d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c: Any = self.conv
        w = c.weight
        if (x.device.type == "cpu" and x.dtype == torch.float32 and w.dtype == torch.float32
                and torch.backends.mkldnn.enabled and not _autograd(x, w) and not _tracing()):
            ops = _onednn_ops()
            if ops is not None:
                if self.transposed:
                    return ops[1](x, w, c.bias, list(c.padding), list(c.output_padding), list(c.stride),
                                  list(c.dilation), c.groups, self.act, [], "")
                return ops[0](x, w, c.bias, list(c.padding), list(c.stride), list(c.dilation), c.groups,
                              self.act, [], "")
        y = c(x)
        return _ACTS[self.act](y, not _autograd(y))


class Act(nn.Module):
    """Hard-swish followed by a learnable affine. In the fused network the hard-swish is the conv's
    post-op (:class:`ConvAct`) and :meth:`affine_` applies the affine in place, or nothing once
    it is folded into the next conv (``lab`` None)."""

    def __init__(self):
        super().__init__()
        self.act = nn.Hardswish()
        self.lab = Affine()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lab(self.act(x))

    def affine_(self, x: torch.Tensor) -> torch.Tensor:
        """``scale * x + bias`` in one pass, in place on ``x`` (a conv's fresh output) unless
        autograd records it."""
        lab = self.lab
        if lab is None:
            return x
        if _autograd(x, lab.scale, lab.bias):
            return torch.addcmul(lab.bias, x, lab.scale)
        return torch.addcmul(lab.bias, x, lab.scale, out=x)


@functools.lru_cache(maxsize=256)
def _outside_taps(n_out: int, size: int, k: int, stride: int, pad: int) -> tuple[tuple[int, int, int], ...]:
    """Along one axis of a zero-padded conv: ``(i, lo, hi)`` for each output index ``i`` whose
    window reaches into the padding - its taps ``[0, lo)`` and ``[hi, k)`` fall outside the input
    of ``size`` - only the first and last few indices."""
    out = []
    for i in sorted(set(range(min(n_out, pad // stride + 2))) | set(range(max(0, n_out - k // stride - 2), n_out))):
        start = stride * i - pad
        lo, hi = max(0, -start), min(k, size - start)
        if lo > 0 or hi < k:
            out.append((i, lo, hi))
    return tuple(out)


class PaddedInputAffine(nn.Module):
    """The border term of an input affine folded into a zero-padded conv.

    For scalars ``s, t``: ``conv_W(pad0(s x + t)) = conv_sW(pad0(x)) + t * sum(W)`` wherever the
    conv's window lies inside the input; where it reaches into the padding, the taps outside saw
    zeros, not ``t``, so ``t`` times those taps' weights comes off again. The folded conv carries
    ``s W`` and the bias ``b + t * sum(W)``; this module then subtracts, in place on the conv's
    output, ``t`` times the sum of the outside taps at each border position - a few thin strips,
    whose per-channel sums are tabulated per pattern of outside taps (``v = t * W`` summed over
    the input channels of each output channel)."""

    def __init__(self, v: torch.Tensor, stride: tuple[int, int], padding: tuple[int, int]):
        super().__init__()
        o, kh, kw = v.shape
        self.stride, self.padding, self.kernel = tuple(stride), tuple(padding), (kh, kw)
        rows, cols = v.sum(2), v.sum(1)   # (O, kh), (O, kw)
        rtab = torch.zeros(kh + 1, kh + 1, o, dtype=v.dtype, device=v.device)
        ctab = torch.zeros(kw + 1, kw + 1, o, dtype=v.dtype, device=v.device)
        btab = torch.zeros((kh + 1) ** 2, (kw + 1) ** 2, o, dtype=v.dtype, device=v.device)   # 3-D: no memory format
        for lo in range(kh + 1):
            for hi in range(lo, kh + 1):
                rtab[lo, hi] = rows[:, :lo].sum(1) + rows[:, hi:].sum(1)
                out_r = v[:, list(range(lo)) + list(range(hi, kh))]
                for clo in range(kw + 1):
                    for chi in range(clo, kw + 1):
                        btab[lo * (kh + 1) + hi, clo * (kw + 1) + chi] = out_r[:, :, list(range(clo)) + list(range(chi, kw))].sum((1, 2))
        for lo in range(kw + 1):
            for hi in range(lo, kw + 1):
                ctab[lo, hi] = cols[:, :lo].sum(1) + cols[:, hi:].sum(1)
        self.register_buffer("rtab", rtab, persistent=False)
        self.register_buffer("ctab", ctab, persistent=False)
        self.register_buffer("btab", btab, persistent=False)

    def forward(self, out: torch.Tensor, in_hw: tuple[int, int]) -> torch.Tensor:
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        rows = _outside_taps(out.shape[-2], int(in_hw[0]), kh, sh, ph)
        cols = _outside_taps(out.shape[-1], int(in_hw[1]), kw, sw, pw)
        for i, lo, hi in rows:
            out[:, :, i, :].sub_(self.rtab[lo, hi].view(1, -1, 1))
        for j, lo, hi in cols:
            out[:, :, :, j].sub_(self.ctab[lo, hi].view(1, -1, 1))
        for i, lo, hi in rows:   # taps outside both ways came off twice: once back
            for j, clo, chi in cols:
                out[:, :, i, j].add_(self.btab[lo * (kh + 1) + hi, clo * (kw + 1) + chi].view(1, -1))
        return out


class RepLayer(nn.Module):
    """Sum of ``branches`` kxk conv+BN, a 1x1 conv+BN (k > 1) and a BN identity (same width, stride
    1), then a learnable affine and (unless the stride is 2) :class:`Act`."""

    def __init__(self, cin: int, cout: int, k: int, stride=1, groups: int = 1, branches: int = 4):
        super().__init__()
        self.stride = stride
        self.identity = nn.BatchNorm2d(cin) if cin == cout and stride == 1 else None
        self.conv_kxk = nn.ModuleList(ConvBN(cin, cout, k, stride, groups) for _ in range(branches))
        self.conv_1x1 = ConvBN(cin, cout, 1, stride, groups) if k > 1 else None
        self.lab = Affine()
        self.act = Act()
        self.fused: ConvAct | None = None   # set by fuse(): the merged conv, its hard-swish a post-op
        self.in_affine: PaddedInputAffine | None = None   # set by fold_input_affine()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            out = self.fused(x)
            if self.in_affine is not None:
                out = self.in_affine(out, x.shape[-2:])
            return out if self.stride == 2 else self.act.affine_(out)
        out = self.identity(x) if self.identity is not None else 0
        if self.conv_1x1 is not None:
            out = out + self.conv_1x1(x)
        for conv in self.conv_kxk:
            out = out + conv(x)
        out = self.lab(out)
        return out if self.stride == 2 else self.act(out)

    @torch.no_grad()
    def fuse(self) -> None:
        """Sum the branches into one kxk conv with bias (each BatchNorm folded; the 1x1 kernel and
        the identity placed at the kernel's centre), fold the learnable affine into it and make the
        activation's hard-swish its post-op (:class:`ConvAct`; none after a stride-2 layer)."""
        if self.fused is not None:
            return
        ref: Any = self.conv_kxk[0].conv
        bn0: Any = self.conv_kxk[0].bn
        k = ref.kernel_size[0]
        c = k // 2
        weight = torch.zeros_like(ref.weight)
        bias = torch.zeros_like(bn0.running_mean)
        branches: Any = self.conv_kxk
        for branch in branches:
            f = fold_conv(branch.conv, branch.bn)
            weight += f.weight
            bias += f.bias
        if self.conv_1x1 is not None:
            f = fold_conv(self.conv_1x1.conv, self.conv_1x1.bn)
            weight[:, :, c, c] += f.weight[:, :, 0, 0]
            bias += f.bias
        if self.identity is not None:   # x = a conv whose kernel is 1 at the centre of its own channel
            eye = torch.zeros_like(ref.weight)
            per_group = ref.in_channels // ref.groups
            eye[torch.arange(ref.out_channels), torch.arange(ref.out_channels) % per_group, c, c] = 1.0
            probe = nn.Conv2d(ref.in_channels, ref.out_channels, k, ref.stride, ref.padding, groups=ref.groups,
                              bias=False).to(ref.weight)
            probe.weight.copy_(eye)
            f = fold_conv(probe, self.identity)
            weight += f.weight
            bias += f.bias
        fused = nn.Conv2d(ref.in_channels, ref.out_channels, k, ref.stride, ref.padding, groups=ref.groups,
                          bias=True).to(ref.weight)
        fused.weight.copy_(weight * self.lab.scale)
        fused.bias.copy_(bias * self.lab.scale + self.lab.bias)
        self.fused = ConvAct(fused.requires_grad_(False), "none" if self.stride == 2 else "hardswish")
        del self.identity, self.conv_kxk, self.conv_1x1, self.lab

    @torch.no_grad()
    def fold_input_affine(self, s: torch.Tensor, t: torch.Tensor) -> bool:
        """After :meth:`fuse` of a stride-2 layer (a linear output): take the affine ``s x + t``
        (scalars) of its input into the conv - ``s W``, ``b + t sum(W)`` and a
        :class:`PaddedInputAffine` for the border. False (nothing done) for another layer."""
        if self.fused is None or self.stride != 2 or self.in_affine is not None:
            return False
        conv: Any = self.fused.conv
        w = conv.weight
        self.in_affine = PaddedInputAffine(t * w.sum(1), conv.stride, conv.padding)
        conv.bias.add_(t * w.sum((1, 2, 3)))
        w.mul_(s)
        return True


class SE(nn.Module):
    """Squeeze-excitation: global mean -> 1x1 (C/4) -> ReLU -> 1x1 (C) -> hard-sigmoid gate."""

    def __init__(self, c: int, reduction: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c // reduction, 1)
        self.conv2 = nn.Conv2d(c // reduction, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * F.hardsigmoid(self.conv2(F.relu(self.conv1(s))))


class LCNetV3Block(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride, use_se: bool, branches: int):
        super().__init__()
        self.dw_conv = RepLayer(cin, cin, k, stride, groups=cin, branches=branches)
        self.se = SE(cin) if use_se else None
        self.pw_conv = RepLayer(cin, cout, 1, 1, branches=branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dw_conv(x)
        if self.se is not None:
            x = self.se(x)
        return self.pw_conv(x)

    @torch.no_grad()
    def fold_act_affine(self) -> None:
        """After :meth:`RepLayer.fuse` of both layers: the depthwise layer's activation affine
        ``s * y + t`` folded into the pointwise conv that reads it (a 1x1 conv has no padding, so
        ``W (s y + t) + b = (s W) y + (b + t W 1)`` exactly); not across a squeeze-excitation."""
        dw, pw = self.dw_conv, self.pw_conv
        if self.se is not None or dw.fused is None or pw.fused is None or dw.stride == 2:
            return
        act: Any = dw.act
        if act.lab is None:
            return
        s, t = act.lab.scale, act.lab.bias
        conv: Any = pw.fused.conv
        conv.bias.add_(t * conv.weight.sum((1, 2, 3)))
        conv.weight.mul_(s)
        act.lab = None


class PPLCNetV3(nn.Module):
    """The backbone; ``det=True``: the four stage maps (1/4..1/32) projected to the neck's input
    widths; else the recognition feature map pooled to height 1: (B, C, 1, W/8)."""

    def __init__(self, scale: float, det: bool, branches: int = 4):
        super().__init__()
        self.det = det
        table = _DET_BLOCKS if det else _REC_BLOCKS
        self.conv1 = ConvBN(3, make_divisible(16 * scale), 3, 2)
        for name, rows in table.items():
            setattr(self, name, nn.Sequential(*[
                LCNetV3Block(make_divisible(cin * scale), make_divisible(cout * scale), k, s, se, branches)
                for k, cin, cout, s, se in rows]))
        if det:
            widths = [make_divisible(table[b][-1][2] * scale) for b in ("blocks3", "blocks4", "blocks5", "blocks6")]
            self.layer_list = nn.ModuleList(nn.Conv2d(c, int(p * scale), 1) for c, p in zip(widths, _DET_PROJ))
            self.out_channels = [int(p * scale) for p in _DET_PROJ]
        else:
            self.out_channels = make_divisible(512 * scale)

    @torch.no_grad()
    def fold_stage_affines(self) -> None:
        """After :meth:`RepLayer.fuse` (detection backbone): the activation affine ending each stage
        folded into every conv that reads it - the stage's 1x1 projection (exactly, no padding)
        and the next stage's first depthwise conv, whose stride 2 leaves its output linear (with
        :class:`PaddedInputAffine` for the border) - so no pass over a stage's output applies it."""
        if not self.det:
            return
        stages = [self.blocks2, self.blocks3, self.blocks4, self.blocks5, self.blocks6]
        for i, stage in enumerate(stages):
            pw: Any = stage[-1].pw_conv
            lab = pw.act.lab if pw.fused is not None else None
            nxt: Any = stages[i + 1][0].dw_conv if i + 1 < len(stages) else None
            if lab is None or (nxt is not None and (nxt.fused is None or nxt.stride != 2 or nxt.in_affine is not None)):
                continue
            s, t = lab.scale, lab.bias
            if i >= 1:   # blocks3..6 feed a projection
                proj: Any = self.layer_list[i - 1]
                if proj.bias is None:
                    continue
                proj.bias.add_(t * proj.weight.sum((1, 2, 3)))
                proj.weight.mul_(s)
            if nxt is not None:
                nxt.fold_input_affine(s, t)
            pw.act.lab = None

    def forward(self, x: torch.Tensor):
        x = self.blocks2(self.conv1(x))
        outs = []
        for name in ("blocks3", "blocks4", "blocks5", "blocks6"):
            x = getattr(self, name)(x)
            outs.append(x)
        if self.det:
            return [proj(o) for proj, o in zip(self.layer_list, outs)]
        return F.avg_pool2d(x, (3, 2))


# ----------------------------------------------------------------------------- detection
class NeckSE(nn.Module):
    """The neck's squeeze-excitation: global mean -> 1x1 -> ReLU -> 1x1 -> hard-sigmoid
    ``clip(0.2 x + 0.5, 0, 1)`` (slope 0.2, not hard-sigmoid's usual 1/6); :meth:`gate` is the
    per-channel factor alone."""

    def __init__(self, c: int, reduction: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c // reduction, 1)
        self.conv2 = nn.Conv2d(c // reduction, c, 1)

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        s = self.conv2(F.relu(self.conv1(x.mean((2, 3), keepdim=True))))
        return (0.2 * s + 0.5).clamp(0.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)


class RSELayer(nn.Module):
    """Conv (no bias) then a residual squeeze-excitation: ``y + se(y)``, computed as
    ``y * (1 + gate)`` (one pass over the map instead of two; equal up to float32 rounding)."""

    def __init__(self, cin: int, cout: int, k: int):
        super().__init__()
        self.in_conv = nn.Conv2d(cin, cout, k, padding=k // 2, bias=False)
        self.se_block = NeckSE(cout)

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The conv's output ``y`` and the per-channel factor ``1 + gate`` (B, C, 1, 1)."""
        y = self.in_conv(x)
        return y, self.se_block.gate(y) + 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, factor = self.parts(x)
        return y * factor


def _nearest_view(x: torch.Tensor, f: int) -> torch.Tensor:
    """(B, C, H, W) -> the (B, C, H/f, f, W/f, f) view whose element [.., i, a, j, b] is pixel
    (f i + a, f j + b): a nearest upsampling by ``f`` of a (B, C, H/f, 1, W/f, 1) map broadcasts
    into it without being materialized."""
    b, c, h, w = x.shape
    return x.unflatten(3, (w // f, f)).unflatten(2, (h // f, f))


class RSEFPN(nn.Module):
    """Top-down FPN over the four backbone maps (nearest 2x upsampling, sums), each level reduced
    to a quarter width by a 3x3 RSE layer, upsampled to 1/4 and concatenated (deepest first).

    Without autograd no upsampled map is materialized and no RSE output is written twice: each
    top-down sum is one ``addcmul`` of the coarser map broadcast over 2x2 blocks and the RSE's
    conv output times its factor, and each level's RSE product is written broadcast over its
    blocks straight into its channels of the concatenated output (the same values as RSE,
    interpolate, add and cat, up to float32 rounding). With autograd, or tracing for an export:
    those operators."""

    def __init__(self, in_channels: list[int], out_channels: int):
        super().__init__()
        self.ins_conv = nn.ModuleList(RSELayer(c, out_channels, 1) for c in in_channels)
        self.inp_conv = nn.ModuleList(RSELayer(out_channels, out_channels // 4, 3) for _ in in_channels)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        if torch.is_grad_enabled() or _tracing():   # autograd, export: the reference operators
            return self._reference(feats)
        c2, c3, c4, c5 = feats
        # the convs in the reference's order (scripts/convert_rapidocr.py maps weights by call order)
        y5, g5 = self.ins_conv[3].parts(c5)
        y4, g4 = self.ins_conv[2].parts(c4)
        y3, g3 = self.ins_conv[1].parts(c3)
        y2, g2 = self.ins_conv[0].parts(c2)
        up = (slice(None), slice(None), slice(None), None, slice(None), None)   # (B, C, h, 1, w, 1)
        in5 = y5 * g5
        out4 = torch.empty_like(y4)   # in4 + nearest2x(in5) with in4 = y4 * g4, in one pass
        torch.addcmul(in5[up], _nearest_view(y4, 2), g4[up], out=_nearest_view(out4, 2))
        out3 = torch.empty_like(y3)
        torch.addcmul(out4[up], _nearest_view(y3, 2), g3[up], out=_nearest_view(out3, 2))
        out2 = torch.empty_like(y2)
        torch.addcmul(out3[up], _nearest_view(y2, 2), g2[up], out=_nearest_view(out2, 2))
        b, _, h, w = out2.shape
        c = self.inp_conv[0].in_conv.out_channels
        fmt = torch.channels_last if out2.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
        out = torch.empty((b, 4 * c, h, w), dtype=out2.dtype, device=out2.device, memory_format=fmt)
        for i, (layer, src, f) in enumerate(((self.inp_conv[3], in5, 8), (self.inp_conv[2], out4, 4),
                                             (self.inp_conv[1], out3, 2), (self.inp_conv[0], out2, 1))):
            y, g = layer.parts(src)
            dst = out[:, i * c:(i + 1) * c]
            if f == 1:
                torch.mul(y, g, out=dst)
            else:
                view = _nearest_view(dst, f)
                torch.mul(y[up].expand(view.shape), g[up], out=view)
        return out

    def _reference(self, feats: list[torch.Tensor]) -> torch.Tensor:
        c2, c3, c4, c5 = feats
        in5 = self.ins_conv[3](c5)
        in4 = self.ins_conv[2](c4)
        in3 = self.ins_conv[1](c3)
        in2 = self.ins_conv[0](c2)
        out4 = in4 + F.interpolate(in5, scale_factor=2, mode="nearest")
        out3 = in3 + F.interpolate(out4, scale_factor=2, mode="nearest")
        out2 = in2 + F.interpolate(out3, scale_factor=2, mode="nearest")
        p5 = F.interpolate(self.inp_conv[3](in5), scale_factor=8, mode="nearest")
        p4 = F.interpolate(self.inp_conv[2](out4), scale_factor=4, mode="nearest")
        p3 = F.interpolate(self.inp_conv[1](out3), scale_factor=2, mode="nearest")
        p2 = self.inp_conv[0](out2)
        return torch.cat([p5, p4, p3, p2], 1)


def _deconv_as_1x1(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2x2 stride-2 transposed conv (weight (in, out, 2, 2)) as a 1x1 conv to ``4 * out``
    channels, phase-major: channel ``(2a + b) * out + o`` is output channel ``o`` at offset (a, b)
    of each 2x2 block (the same products and sums; the transposed conv's blocks do not overlap)."""
    cin, cout = weight.shape[:2]
    w = weight.permute(2, 3, 1, 0).reshape(4 * cout, cin, 1, 1)
    return w.contiguous(), bias.repeat(4)


class DBBranch(nn.Module):
    """3x3 conv + BN + ReLU, 2x2 stride-2 transposed conv + BN + ReLU, 2x2 stride-2 transposed conv
    to one channel, sigmoid: a 1/4-resolution feature map -> a full-resolution probability map.

    Fused (:meth:`fuse`): both transposed convs run at the 1/4 resolution as 1x1 convs - the first
    to its four 2x2 phases (ReLU a post-op), the second from each phase to the 4x4 block of the
    output it covers (sigmoid a post-op) - and one pixel shuffle lays the 16 phases out at full
    resolution: no intermediate map at 1/2 resolution, no transposed conv."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c // 4, 3, padding=1, bias=False)
        self.conv_bn1 = nn.BatchNorm2d(c // 4)
        self.conv2 = nn.ConvTranspose2d(c // 4, c // 4, 2, 2)
        self.conv_bn2 = nn.BatchNorm2d(c // 4)
        self.conv3 = nn.ConvTranspose2d(c // 4, 1, 2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.conv1, ConvAct):   # fused: each activation the conv's post-op
            return F.pixel_shuffle(self.conv3(self.conv2(self.conv1(x))), 4)
        x = self.conv1(x)
        x = F.relu(x if self.conv_bn1 is None else self.conv_bn1(x))
        x = self.conv2(x)
        x = F.relu(x if self.conv_bn2 is None else self.conv_bn2(x))
        return torch.sigmoid(self.conv3(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold both BatchNorms into the convs before them, turn the transposed convs into 1x1
        convs at the 1/4 resolution (see the class docstring), each conv and its activation a
        :class:`ConvAct`."""
        if isinstance(self.conv1, ConvAct):
            return
        if self.conv_bn1 is not None:
            self.conv1, self.conv_bn1 = fold_conv(self.conv1, self.conv_bn1), None
            self.conv2, self.conv_bn2 = fold_conv(self.conv2, self.conv_bn2), None
        c2: Any = self.conv2
        c3: Any = self.conv3
        mid, out = c2.out_channels, c3.out_channels
        w2, b2 = _deconv_as_1x1(c2.weight, c2.bias)               # (4 mid, in): phase p = 2a + b
        # the second transposed conv from each phase (a, b) of the first: output channel o at
        # offset (c, d) of the 2x2 block lands at (2a + c, 2b + d) of the 4x4 block, pixel
        # shuffle's channel o * 16 + (2a + c) * 4 + (2b + d)
        w3 = torch.zeros(out * 16, 4 * mid, 1, 1, dtype=c3.weight.dtype, device=c3.weight.device)
        for a in range(2):
            for b in range(2):
                for c in range(2):
                    for d in range(2):
                        k = torch.arange(out, device=w3.device) * 16 + (2 * a + c) * 4 + (2 * b + d)
                        src = (2 * a + b) * mid
                        w3[k, src:src + mid, 0, 0] = c3.weight[:, :, c, d].t()
        b3 = c3.bias.repeat_interleave(16)
        conv2 = nn.Conv2d(c2.in_channels, 4 * mid, 1).to(c2.weight)
        conv3 = nn.Conv2d(4 * mid, out * 16, 1).to(c3.weight)
        conv2.weight.copy_(w2)
        conv2.bias.copy_(b2)
        conv3.weight.copy_(w3)
        conv3.bias.copy_(b3)
        self.conv1 = ConvAct(self.conv1, "relu")
        self.conv2 = ConvAct(conv2.requires_grad_(False), "relu")
        self.conv3 = ConvAct(conv3.requires_grad_(False), "sigmoid")


class DBHead(nn.Module):
    """Differentiable-binarization head. In eval only the shrink (``binarize``) map is computed;
    the ``thresh`` branch (and the approximate binary map) serve DB training only."""

    def __init__(self, c: int):
        super().__init__()
        self.binarize = DBBranch(c)
        self.thresh = DBBranch(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.binarize(x)


class DBDetector(nn.Module):
    """(B, 3, H, W) ImageNet-normalized RGB (H, W multiples of 32) -> (B, 1, H, W) shrink map."""

    def __init__(self, cfg: PPOCRConfig):
        super().__init__()
        self.backbone = PPLCNetV3(cfg.det_scale, det=True, branches=cfg.branches)
        self.neck = RSEFPN(self.backbone.out_channels, cfg.neck_channels)
        self.head = DBHead(cfg.neck_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.backbone(x)))


# --------------------------------------------------------------------------- recognition
class ConvBNSiLU(nn.Module):
    """Conv (no bias) + BatchNorm + SiLU (``norm`` naming, as in the SVTR encoder)."""

    def __init__(self, cin: int, cout: int, k: tuple[int, int] = (1, 1)):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=(k[0] // 2, k[1] // 2), bias=False)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.conv, ConvAct):   # fused: the SiLU is the conv's post-op
            return self.conv(x)
        x = self.conv(x)
        return F.silu(x if self.norm is None else self.norm(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm into the conv, the SiLU its post-op (:class:`ConvAct`)."""
        if self.norm is not None:
            self.conv, self.norm = ConvAct(fold_conv(self.conv, self.norm), "swish"), None


class GlobalAttention(nn.Module):
    """Multi-head self-attention over all positions (fused qkv projection, scaled dot product)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q = q * (c // self.heads) ** -0.5
        attn = (q @ k.transpose(-2, -1)).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.silu(self.fc1(x)))


class SVTRBlock(nn.Module):
    """Pre-norm transformer block (LayerNorm eps 1e-5): attention and a SiLU MLP (2x), residuals."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 2.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.mixer = GlobalAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SVTREncoder(nn.Module):
    """(B, C, 1, T) -> (B, dims, 1, T): 1x3 conv to C/8, 1x1 to ``dims``, SVTR blocks over the T
    positions, LayerNorm (eps 1e-6), 1x1 back to C, concatenated with the input, 1x3 conv to C/8
    and 1x1 to ``dims`` (every conv with BN + SiLU)."""

    def __init__(self, cin: int, dims: int, depth: int, heads: int):
        super().__init__()
        self.conv1 = ConvBNSiLU(cin, cin // 8, (1, 3))
        self.conv2 = ConvBNSiLU(cin // 8, dims)
        self.svtr_block = nn.ModuleList(SVTRBlock(dims, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dims, eps=1e-6)
        self.conv3 = ConvBNSiLU(dims, cin)
        self.conv4 = ConvBNSiLU(2 * cin, cin // 8, (1, 3))
        self.conv1x1 = ConvBNSiLU(cin // 8, dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.conv2(self.conv1(x))
        b, c, h, w = z.shape
        z = z.flatten(2).transpose(1, 2)
        for blk in self.svtr_block:
            z = blk(z)
        z = self.norm(z).reshape(b, h, w, c).permute(0, 3, 1, 2)
        z = torch.cat([x, self.conv3(z)], 1)
        return self.conv1x1(self.conv4(z))


class SequenceEncoder(nn.Module):
    def __init__(self, cin: int, dims: int, depth: int, heads: int):
        super().__init__()
        self.encoder = SVTREncoder(cin, dims, depth, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).squeeze(2).transpose(1, 2)   # (B, T, dims)


class CTCHead(nn.Module):
    def __init__(self, dims: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(dims, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.fc(x)
        return logits if self.training else logits.softmax(-1)


class RecHead(nn.Module):
    def __init__(self, cin: int, cfg: PPOCRConfig):
        super().__init__()
        self.ctc_encoder = SequenceEncoder(cin, cfg.rec_dims, cfg.rec_depth, cfg.rec_heads)
        self.ctc_head = CTCHead(cfg.rec_dims, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ctc_head(self.ctc_encoder(x))


class CTCRecognizer(nn.Module):
    """(B, 3, 48, W) text-line crops scaled to [-1, 1] (W a multiple of 8) -> (B, W/8, classes)
    CTC probabilities in eval (logits in training); index 0 is the blank."""

    def __init__(self, cfg: PPOCRConfig):
        super().__init__()
        self.backbone = PPLCNetV3(cfg.rec_scale, det=False, branches=cfg.branches)
        self.head = RecHead(self.backbone.out_channels, cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


class PPOCRNet(nn.Module):
    """The checkpoint's module: ``det`` (:class:`DBDetector`) and ``rec`` (:class:`CTCRecognizer`).
    ``forward`` runs the detector (the network ``libreyolo info`` and verify see first)."""

    def __init__(self, size: str, num_classes: int | None = None):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown PP-OCR size {size!r}; sizes: {', '.join(CONFIGS)}")
        cfg = CONFIGS[size]
        if num_classes is not None:   # a checkpoint's own alphabet (PP-OCRv4's 6,625 classes, ...)
            if int(num_classes) < 2:
                raise ValueError(f"a PP-OCR recognizer needs at least 2 CTC classes (blank + one), got {num_classes}")
            cfg = replace(cfg, num_classes=int(num_classes))
        self.cfg = cfg
        self.det = DBDetector(cfg)
        self.rec = CTCRecognizer(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.det(x)

    @torch.no_grad()
    def fuse(self) -> PPOCRNet:
        """Re-parameterize in place for inference (see the module docstring); idempotent."""
        for m in list(self.modules()):
            if isinstance(m, RepLayer):
                m.fuse()
        for m in list(self.modules()):
            if isinstance(m, (ConvBN, ConvBNSiLU, DBBranch)):
                m.fuse()
        for m in list(self.modules()):
            if isinstance(m, LCNetV3Block):
                m.fold_act_affine()
        for m in list(self.modules()):
            if isinstance(m, PPLCNetV3):
                m.fold_stage_affines()
        return self
