"""Instance masks at an original image's pixels from mask logits on the letterboxed canvas.

Each mask pixel is the instance's logits read bilinearly at the pixel centre mapped into the
canvas (the letterbox inverted), edges clamped, kept where it is above a threshold and the
pixel centre lies inside the instance's box. The sampling is separable - a column's source
position depends on its x only, a row's on its y only - so it is written as two 1-D tables
(:func:`axis_table`: the two source indices and the weight of the second, per output column and
per output row) and one formula, evaluated in this order by every implementation here::

    top = v00 + (v01 - v00) * tx
    bot = v10 + (v11 - v10) * tx
    val = top + (bot - top) * ty

The source position is ``grid_sample``'s (``align_corners=False``, border padding) for the same
normalized coordinate, so the values are ``grid_sample``'s up to its rounding (a different order
of the same products; a pixel's mask can differ only where the logit is within a few ulps of the
threshold).

Two implementations give the same bits: :func:`masks_torch` (plain tensor ops, each a separate
rounding; any device, any set of pixels - the CPU samples only each box's window) and, on CUDA
with Triton, :func:`masks_triton`, one kernel for every instance and pixel that writes the bool
masks directly (sample, threshold and box test fused, tiles outside the box written as False
without reading the logits; or, given each instance's pixel window, the output zeroed by one
fill and only the windows' tiles visited). ``grid_sample`` followed by the threshold and the
box cut needs a (n, H, W, 2) grid and four full-size passes; this kernel is one pass over the
output (a 720p image with 138 instances: 127 M mask pixels), which is why it is written here. It is compiled without
floating-point contraction so that its products and sums round as :func:`masks_torch`'s.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

try:  # Triton ships with CUDA builds of torch; a CPU-only install may lack it
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the install
    triton = None

__all__ = ["available", "axis_table", "axis_tables", "masks_torch", "masks_triton"]


#: whether predict uses :func:`masks_triton` on CUDA (on since ``tests/gpu/test_mask_sample_gpu.py``
#: passed on a GPU, docs/families.md names the run); off, CUDA samples with ``grid_sample`` over
#: the whole image (:func:`libreyolo.tasks.segment.task.grid_sample_masks`), its earlier way.
FUSED_ON_CUDA = True
#: whether predict's kernel visits only each instance's box window (:func:`masks_triton`'s
#: ``windows``) after one zero fill, instead of every pixel of every instance; off until
#: ``tests/gpu/test_mask_sample_gpu.py`` passes with it on a GPU (docs/families.md)
WINDOWS_ON_CUDA = False


def available(device: torch.device) -> bool:
    """True when :func:`masks_triton` can run on ``device``."""
    return triton is not None and torch.device(device).type == "cuda"


def axis_table(n_out: int, scale: float, pad: float, canvas: int, n_in: int, device: torch.device | str
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One axis of the sampling: output pixel ``o`` (centre ``o + 0.5``) -> canvas position
    ``(o + 0.5) * scale + pad`` -> normalized to [-1, 1] over the canvas -> the logits' source
    position ``((g + 1) * n_in - 1) / 2`` clamped to ``[0, n_in - 1]``. Returns the (n_out,)
    int32 indices ``i0``, ``i1 = min(i0 + 1, n_in - 1)`` and the float32 weight ``t = src - i0``."""
    o = torch.arange(n_out, device=device, dtype=torch.float32)
    g = ((o + 0.5) * scale + pad) / canvas * 2 - 1
    src = (((g + 1) * n_in - 1) / 2).clamp(0, n_in - 1)
    i0 = src.floor()
    t = src - i0
    i0 = i0.to(torch.int32)
    return i0, (i0 + 1).clamp_(max=n_in - 1), t


@lru_cache(maxsize=64)
def axis_tables(h: int, w: int, sx: float, sy: float, px: float, py: float, canvas: int, ph: int, pw: int,
                device: torch.device) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The column and row tables (:func:`axis_table`) of one image size, letterbox and logits
    size, built once and reused: a video's frames or a folder of same-sized images ask for the
    same tables every call (two tables are about a dozen small device ops). Read-only: every
    user indexes them, none writes."""
    return axis_table(w, sx, px, canvas, pw, device), axis_table(h, sy, py, canvas, ph, device)


def masks_torch(logits: torch.Tensor, xt, yt, boxes: torch.Tensor, thr: float,
                xs: torch.Tensor | None = None, ys: torch.Tensor | None = None) -> torch.Tensor:
    """(n, ph, pw) float32 logits, the column and row tables of :func:`axis_table`, (n, 4) xyxy
    float32 boxes -> (n, len(ys), len(xs)) bool masks at the output pixels ``xs`` (n, ww) and
    ``ys`` (n, hh) (int64; default: every column and row of the tables, shared).

    ``top`` and ``bot`` depend on the row only through its source row, so the columns are
    interpolated once per source row (``a``: the rows the output rows read, at the output
    columns) and each output row gathers its two: the formula's values, with the work of one
    gather at the output's size instead of four."""
    n = logits.shape[0]
    dev = logits.device
    if xs is None:
        xs = torch.arange(xt[0].shape[0], device=dev).expand(n, -1)
    if ys is None:
        ys = torch.arange(yt[0].shape[0], device=dev).expand(n, -1)
    x0, x1, tx = (v[xs] for v in xt)                                  # (n, ww)
    y0, y1, ty = (v[ys] for v in yt)                                  # (n, hh)
    lo, hi = int(y0.min()), int(y1.max()) + 1                         # the source rows read
    rows = logits[:, lo:hi]                                           # (n, r, pw)
    r = hi - lo
    c0 = rows.gather(2, x0.long()[:, None, :].expand(-1, r, -1))
    c1 = rows.gather(2, x1.long()[:, None, :].expand(-1, r, -1))
    a = c0 + (c1 - c0) * tx[:, None, :]                               # (n, r, ww): top / bot per source row
    ww = a.shape[2]
    top = a.gather(1, (y0.long() - lo)[:, :, None].expand(-1, -1, ww))
    bot = a.gather(1, (y1.long() - lo)[:, :, None].expand(-1, -1, ww))
    val = top + (bot - top) * ty[:, :, None]
    cx = xs.to(torch.float32) + 0.5
    cy = ys.to(torch.float32) + 0.5
    b = boxes.to(torch.float32)
    inx = (cx >= b[:, 0:1]) & (cx <= b[:, 2:3])
    iny = (cy >= b[:, 1:2]) & (cy <= b[:, 3:4])
    return (val > thr) & iny[:, :, None] & inx[:, None, :]


if triton is not None:
    @triton.jit
    def _masks_kernel(logits_ptr, x0_ptr, x1_ptr, tx_ptr, y0_ptr, y1_ptr, ty_ptr, boxes_ptr, win_ptr, out_ptr, thr,
                      H, W, PH, PW, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, WINDOWED: tl.constexpr):
        i = tl.program_id(0)
        if WINDOWED:   # the tiles cover the instance's pixel window (x0, y0, x1, y1; ends exclusive)
            ox = tl.load(win_ptr + i * 4)
            oy = tl.load(win_ptr + i * 4 + 1)
            ex = tl.load(win_ptr + i * 4 + 2)
            ey = tl.load(win_ptr + i * 4 + 3)
        else:          # the tiles cover the image
            ox = 0
            oy = 0
            ex = W
            ey = H
        r0 = oy + tl.program_id(1) * BLOCK_H
        c0 = ox + tl.program_id(2) * BLOCK_W
        rows = r0 + tl.arange(0, BLOCK_H)
        cols = c0 + tl.arange(0, BLOCK_W)
        rm = rows < ey
        cm = cols < ex
        m2 = rm[:, None] & cm[None, :]
        bx0 = tl.load(boxes_ptr + i * 4)
        by0 = tl.load(boxes_ptr + i * 4 + 1)
        bx1 = tl.load(boxes_ptr + i * 4 + 2)
        by1 = tl.load(boxes_ptr + i * 4 + 3)
        cx = cols.to(tl.float32) + 0.5
        cy = rows.to(tl.float32) + 0.5
        inside = ((cy >= by0) & (cy <= by1))[:, None] & ((cx >= bx0) & (cx <= bx1))[None, :]
        off = i.to(tl.int64) * H * W + rows.to(tl.int64)[:, None] * W + cols[None, :]
        # a tile with no pixel centre inside the box: False without reading the logits (with
        # windows, the output is zeroed before the launch: nothing to write)
        lo_x = c0.to(tl.float32) + 0.5
        lo_y = r0.to(tl.float32) + 0.5
        if (lo_x + BLOCK_W - 1 < bx0) | (lo_x > bx1) | (lo_y + BLOCK_H - 1 < by0) | (lo_y > by1):
            if not WINDOWED:
                tl.store(out_ptr + off, tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.int8), mask=m2)
        else:
            y0 = tl.load(y0_ptr + rows, mask=rm, other=0)
            y1 = tl.load(y1_ptr + rows, mask=rm, other=0)
            ty = tl.load(ty_ptr + rows, mask=rm, other=0.0)
            x0 = tl.load(x0_ptr + cols, mask=cm, other=0)
            x1 = tl.load(x1_ptr + cols, mask=cm, other=0)
            tx = tl.load(tx_ptr + cols, mask=cm, other=0.0)
            base = logits_ptr + i.to(tl.int64) * PH * PW
            v00 = tl.load(base + y0[:, None] * PW + x0[None, :], mask=m2, other=0.0)
            v01 = tl.load(base + y0[:, None] * PW + x1[None, :], mask=m2, other=0.0)
            v10 = tl.load(base + y1[:, None] * PW + x0[None, :], mask=m2, other=0.0)
            v11 = tl.load(base + y1[:, None] * PW + x1[None, :], mask=m2, other=0.0)
            top = v00 + (v01 - v00) * tx[None, :]
            bot = v10 + (v11 - v10) * tx[None, :]
            val = top + (bot - top) * ty[:, None]
            keep = (val > thr) & inside
            tl.store(out_ptr + off, keep.to(tl.int8), mask=m2)


#: the kernel's tile (rows x columns of output pixels per program)
BLOCK_H, BLOCK_W = 16, 64


def masks_triton(logits: torch.Tensor, xt, yt, boxes: torch.Tensor, thr: float,
                 windows: np.ndarray | None = None) -> torch.Tensor:
    """:func:`masks_torch` over every pixel, as one CUDA kernel: (n, ph, pw) float32 logits, the
    tables, (n, 4) boxes -> (n, H, W) bool, the same bits.

    ``windows``: (n, 4) int pixel windows ``x0, y0, x1, y1`` (ends exclusive, inside the image)
    holding every pixel whose centre can lie inside each box
    (:func:`libreyolo.tasks.segment.task.box_windows`, from a host copy of the boxes): the output
    is zeroed by one fill and the kernel visits only the windows' tiles - a fraction of the
    image where instances are small, instead of writing every pixel of every instance. The same
    bits either way (every pixel outside a window is outside its box: False)."""
    if triton is None:
        raise RuntimeError("masks_triton needs Triton")
    n, ph, pw = logits.shape
    h, w = yt[0].shape[0], xt[0].shape[0]
    windowed = windows is not None
    out = (torch.zeros if windowed else torch.empty)((n, h, w), dtype=torch.bool, device=logits.device)
    if n == 0 or h == 0 or w == 0:
        return out
    logits = logits.float().contiguous()
    boxes = boxes.float().contiguous()
    if windowed:
        win = np.asarray(windows, dtype=np.int64).reshape(n, 4)
        span_w, span_h = int((win[:, 2] - win[:, 0]).max()), int((win[:, 3] - win[:, 1]).max())
        if span_w <= 0 or span_h <= 0:   # every window empty: no pixel inside any box
            return out
        win_t = torch.from_numpy(win.astype(np.int32)).to(logits.device)
        grid = (n, triton.cdiv(span_h, BLOCK_H), triton.cdiv(span_w, BLOCK_W))
    else:
        win_t = boxes   # not read
        grid = (n, triton.cdiv(h, BLOCK_H), triton.cdiv(w, BLOCK_W))
    _masks_kernel[grid](logits, *(v.contiguous() for v in xt), *(v.contiguous() for v in yt), boxes, win_t,
                        out.view(torch.int8), float(thr), h, w, ph, pw, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W,
                        WINDOWED=windowed, enable_fp_fusion=False)
    return out
