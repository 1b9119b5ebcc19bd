"""Letterbox in torch, so it runs on the GPU (and inside a captured graph).

``mode="topleft"`` (the default, the LibreYOLO checkpoint convention ``letterbox_pad:
topleft``): the image is scaled to fit an ``imgsz`` x ``imgsz`` square keeping its aspect
ratio, placed at the top-left corner, and the rest is filled with grey 114.
``mode="center"``: the same, centred. ``mode="stretch"``: resized to the square ignoring the
aspect ratio, no padding (PicoDet's convention). Output is float RGB in [0, 1], NCHW.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PAD_VALUE = 114.0


@dataclass(frozen=True)
class LetterboxParams:
    """How an (h, w) image lands on the square canvas: scale and resized size."""

    size: int
    scale: float
    new_h: int
    new_w: int
    pad_x: int = 0
    pad_y: int = 0


MODES = ("topleft", "center", "stretch")


@functools.lru_cache(maxsize=512)  # called per image per predict; a frozen dataclass is slow to build
def letterbox_params(h: int, w: int, size: int, mode: str = "topleft") -> LetterboxParams:
    if h <= 0 or w <= 0:
        raise ValueError(f"cannot letterbox an empty image of size {h}x{w}")
    if mode not in MODES:
        raise ValueError(f"letterbox mode must be one of {MODES}, got {mode!r}")
    if mode == "stretch":
        return LetterboxParams(size, size / max(h, w), size, size, 0, 0)
    scale = min(size / h, size / w)
    # Truncated, as every letterboxing family of LibreYOLO computes it (``int(side * ratio)``).
    new_h = max(1, min(size, int(h * scale)))
    new_w = max(1, min(size, int(w * scale)))
    pad_x, pad_y = ((size - new_w) // 2, (size - new_h) // 2) if mode == "center" else (0, 0)
    return LetterboxParams(size, scale, new_h, new_w, pad_x, pad_y)


def image_region(t: torch.Tensor, h: int, w: int, size: int, mode: str = "topleft") -> torch.Tensor:
    """The part of a (..., size, size) map over the letterboxed square that an (h, w) image
    covers, as a view (the whole map for "stretch", whose image fills the square)."""
    if mode == "stretch":
        return t
    p = letterbox_params(h, w, size, mode)
    return t[..., p.pad_y:p.pad_y + p.new_h, p.pad_x:p.pad_x + p.new_w]


def letterbox(images_u8: torch.Tensor, size: int, mode: str = "topleft", *, antialias: bool = False,
              quantize: bool = False, pad: float = PAD_VALUE) -> torch.Tensor:
    """(B, H, W, 3) uint8 RGB -> (B, 3, size, size) float32 in [0, 1], image at top-left.

    To float, resize (bilinear; ``antialias``: PIL's resampling, which widens the filter when it
    shrinks; ``quantize``: rounded to whole levels, as a resize of uint8 pixels gives), pad with
    114 (or ``pad``), divide by 255. The padding is divided with the image (on CUDA a division by a scalar
    multiplies by its float32 reciprocal, so the padding's value depends on the device:
    computing it on the host would not give the same numbers).
    """
    if images_u8.dim() != 4 or images_u8.shape[-1] != 3:
        raise ValueError(f"letterbox expects (B, H, W, 3) images, got shape {tuple(images_u8.shape)}")
    if images_u8.dtype != torch.uint8:
        raise ValueError(f"letterbox expects uint8 images, got {images_u8.dtype}")
    _, h, w, _ = images_u8.shape
    p = letterbox_params(h, w, size, mode)
    # Contiguous NCHW float in one copy: a permuted (channels-last) tensor would carry its
    # memory format through interpolate/pad into every convolution of the network.
    x = images_u8.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    if (p.new_h, p.new_w) != (h, w):
        x = F.interpolate(x, size=(p.new_h, p.new_w), mode="bilinear", align_corners=False, antialias=antialias)
        if quantize:
            x = x.round_().clamp_(0, 255)
    if (p.new_h, p.new_w) != (size, size):
        x = F.pad(x, (p.pad_x, size - p.new_w - p.pad_x, p.pad_y, size - p.new_h - p.pad_y), value=float(pad))
    return x.div_(255.0)


def unletterbox_boxes(boxes, sx: float, sy: float, h: int, w: int, pad_x: int = 0, pad_y: int = 0):
    """Map xyxy boxes (n, >=4), a torch tensor or a numpy array, from the canvas back to an
    (h, w) image and clip, in place. Both give the same float32 numbers (the scalars are
    rounded to float32 first, then one subtraction, one correctly rounded division, a clip)."""
    boxes[:, 0:4:2] = ((boxes[:, 0:4:2] - pad_x) / sx).clip(0, w)
    boxes[:, 1:4:2] = ((boxes[:, 1:4:2] - pad_y) / sy).clip(0, h)
    return boxes


def inverse_params(h: int, w: int, size: int, mode: str = "topleft") -> tuple[float, float, int, int]:
    """``(scale_x, scale_y, pad_x, pad_y)`` that map an (h, w) image's canvas boxes back
    (:func:`unletterbox_boxes`): per axis the resized size over the original, which rounding
    makes differ slightly between x and y."""
    p = letterbox_params(h, w, size, mode)
    return p.new_w / w, p.new_h / h, p.pad_x, p.pad_y


def geometry_rows(shapes, size: int, mode: str = "topleft") -> list[list[list[float]]]:
    """Per image (h, w): ``[[pad_x, pad_y] * 2, [scale_x, scale_y] * 2, [w, h] * 2]``, the three
    (4,) rows :func:`unletterbox_packed` reads for the x1, y1, x2, y2 columns."""
    rows = []
    for h, w in shapes:
        sx, sy, px, py = inverse_params(int(h), int(w), size, mode)
        rows.append([[px, py] * 2, [sx, sy] * 2, [float(w), float(h)] * 2])
    return rows


def unletterbox_packed(packed: torch.Tensor, geometry: torch.Tensor, max_det: int, cols: int = 6) -> torch.Tensor:
    """In place: the boxes of a packed (B, max_det * cols + 1) detection tensor (see
    :func:`libreyolo.ops.nms_graph.select_packed`; ``cols`` 7 for its ``with_index`` rows) from
    the canvas to each image's pixels, clipped; ``geometry`` is the (B, 3, 4) float32 tensor of
    :func:`geometry_rows`.

    The same float32 operations as :func:`unletterbox_boxes` on the host (a subtraction, a
    correctly rounded division by a tensor - not a scalar, which CUDA would turn into a
    multiplication by its reciprocal -, a clip), so the numbers are the same; run on the device,
    inside the captured stage, it spares the host a numpy pass per image.
    """
    boxes = packed[:, :max_det * cols].view(packed.shape[0], max_det, cols)[..., :4]
    g = geometry[:, None]
    boxes.sub_(g[..., 0, :]).div_(g[..., 1, :]).clamp_(min=0)
    torch.minimum(boxes, g[..., 2, :], out=boxes)
    return packed


def unletterbox_points(points: torch.Tensor, geometry: torch.Tensor) -> torch.Tensor:
    """In place: (B, ..., 2) canvas points (pose's keypoints) to each image's pixels, not
    clipped (a keypoint may lie outside its image); ``geometry`` as for
    :func:`unletterbox_packed`. The float32 operations of the host's
    ``tasks.pose.task.unletterbox_keypoints`` (a subtraction, a correctly rounded division by a
    tensor), so the same numbers, on the device inside the captured stage."""
    shape = (geometry.shape[0],) + (1,) * (points.dim() - 2) + (2,)
    points.sub_(geometry[:, 0, :2].reshape(shape)).div_(geometry[:, 1, :2].reshape(shape))
    return points
