"""Bilinear resizing whose backward is deterministic.

``F.interpolate(mode="bilinear")``'s CUDA backward scatters each output gradient into its four
source pixels with atomic adds, so two identical training steps give gradients that differ in
their last bits, and a whole-step graph can then only be compared with eager within a noise that
grows over the steps (torch lists that backward among the ops with no deterministic
implementation). :func:`resize_bilinear` keeps ``F.interpolate``'s forward (the same kernel, the
same output bits) and computes the backward as what it is, a separable linear map:
``grad_in = A_h^T @ grad_out @ A_w``, where ``A_h`` (out_h x in_h) and ``A_w`` hold the
interpolation weights. Two matrix products reduce in a fixed order, so the gradient is the same
bits on every run and under capture. Both run in float32 whatever the gradient's dtype, and the
result is rounded once to it: a half-precision first product would round its intermediate too,
which measured several times further from a float64 reference than that one rounding, for little
time saved (docs/families.md, Semantic segmentation).

The weights follow the kernel's index rule for ``align_corners=False`` and an output size (scale
``in / out``): source ``(dst + 0.5) * scale - 0.5`` clamped at 0, its floor and the next index
(clamped at the border), weights ``1 - frac`` and ``frac``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["resize_bilinear", "resize_bilinear_backward", "bilinear_weights"]


def bilinear_weights(n_in: int, n_out: int, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n_out, n_in) matrix of ``F.interpolate``'s 1-D bilinear weights (align_corners=False,
    output size given): row ``d`` holds the two weights output ``d`` takes from its source pixels.

    Computed in float64 and cast to ``dtype``, by elementwise device ops only (a hat function of
    the distance to each source pixel), so it can be recorded inside a capture; a source past the
    last pixel is clamped onto it, where the kernel gives that pixel both weights."""
    scale = n_in / n_out
    src = ((torch.arange(n_out, dtype=torch.float64, device=device) + 0.5) * scale - 0.5).clamp(0, n_in - 1)
    pixel = torch.arange(n_in, dtype=torch.float64, device=device)
    return (1 - (src[:, None] - pixel[None, :]).abs()).clamp_min(0).to(dtype)


class _ResizeBilinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        ctx.in_size = tuple(x.shape[-2:])
        ctx.dtype = x.dtype
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return resize_bilinear_backward(grad, ctx.in_size, ctx.dtype), None


def resize_bilinear_backward(grad: torch.Tensor, in_size: tuple[int, int], dtype: torch.dtype | None = None
                             ) -> torch.Tensor:
    """The gradient of :func:`resize_bilinear` from an input of (H, W) ``in_size`` for the output
    gradient ``grad`` (..., h, w): ``A_h^T @ grad @ A_w`` in float32, rounded once to ``dtype``
    (``grad``'s by default). For custom backwards that end in a resize."""
    (hi, wi), (ho, wo) = in_size, tuple(grad.shape[-2:])
    a_w = _weights(wi, wo, grad.device)
    a_h = _weights(hi, ho, grad.device)
    g = torch.matmul(grad.float(), a_w)                                # (..., ho, wi)
    g = torch.matmul(a_h.t(), g)                                       # (..., hi, wi)
    return g.to(grad.dtype if dtype is None else dtype)


_CACHE: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _weights(n_in: int, n_out: int, device: torch.device) -> torch.Tensor:
    """The float32 weights, kept per (sizes, device) when built outside a capture: one built while
    capturing lives in the graph's memory pool, so it is recorded into the graph, never kept."""
    key = (n_in, n_out, device)
    w = _CACHE.get(key)
    if w is None:
        w = bilinear_weights(n_in, n_out, device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _CACHE[key] = w
    return w


def resize_bilinear(x: torch.Tensor, size: tuple[int, int] | torch.Size) -> torch.Tensor:
    """``F.interpolate(x, size, mode="bilinear", align_corners=False)`` for (B, C, H, W) ``x``,
    with a deterministic backward when ``x`` needs a gradient (the forward is that call itself).

    Traced, exported or compiled, it is the plain call: ``size`` stays symbolic there (the
    custom backward fixes it to integers), and a compiled graph's backward is torch's own."""
    tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()
    if torch.is_grad_enabled() and x.requires_grad and not tracing:
        return _ResizeBilinear.apply(x, (int(size[0]), int(size[1])))
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
