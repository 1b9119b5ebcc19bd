"""A family's preprocessing as data: how uint8 images become the network's input.

Each family declares one :class:`Preprocess` (``Model.PREPROCESS``), as timm's ``pretrained_cfg``
or torchvision's weight transforms do, and a checkpoint may carry its own (metadata key
``preprocess``). The same object drives predict (on the GPU, inside the captured stage),
validation and training (the datasets resize as predict does; the trainer normalizes the batch
as predict does), so the three can never disagree.

``resize``:

* ``"topleft"`` / ``"center"``: letterbox (keep the aspect ratio, pad with grey 114, or ``pad``) with
  the image at the top-left corner or centred;
* ``"stretch"``: resize to the square ignoring the aspect ratio;
* ``"crop"``: resize the shorter side to ``size / crop_pct`` keeping the aspect ratio, then crop
  the centre ``size`` x ``size`` (the ImageNet evaluation transform);
* ``"long"``: resize the longer side to ``size`` keeping the aspect ratio and pad nothing: the
  batch is (B, 3, h', w') with max(h', w') = ``size`` (SAM's transform: the network normalizes and
  zero-pads to its square itself); antialiased when it shrinks, as SAM's PIL resize is.
* ``"cover"``: keep the aspect ratio, scale so that the shorter side reaches ``size``, and round
  each side to a multiple of ``multiple`` (never below ``size``): Depth Anything's
  ``lower_bound`` resize (518 x 784 for a 2:3 image at 518, multiple 14). No padding.
* ``"limit"``: keep the aspect ratio, shrink only an image whose longer side exceeds ``size``
  (to ``size``, sides truncated), then round each side to a multiple of ``multiple`` (at least
  one multiple): PP-OCR's detection resize (``limit_type="max"``). No padding.

"cover" and "limit" give each image size its own (h', w'): images of different sizes cannot
share a batch (:meth:`Preprocess.batch`). Every other rule gives ``size`` x ``size``.

``antialias``: resample as PIL does (the filter widens when it shrinks; bicubic with PIL's
kernel), through ``F.interpolate(..., antialias=True)``; without it, as OpenCV's INTER_LINEAR /
INTER_CUBIC do. ``quantize``: the resized pixels are rounded to whole levels (0-255), as a
resize of uint8 pixels (PIL, OpenCV) returns them, before normalization.

``mean`` / ``std`` (RGB, in [0, 1] units) normalize after resizing; None leaves the [0, 1] input
as it is (families that normalize inside their network, or need no normalization).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .letterbox import MODES as LETTERBOX_MODES
from .letterbox import PAD_VALUE, letterbox

RESIZE_MODES = (*LETTERBOX_MODES, "crop", "long", "cover", "limit")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocess:
    """How images reach a family's network (see the module docstring)."""

    resize: str = "topleft"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    crop_pct: float = 1.0
    #: ``"bilinear"`` or ``"bicubic"``; "crop" and "long" resizing also antialias when they shrink
    interpolation: str = "bilinear"
    #: PIL's resampling (see the module docstring)
    antialias: bool = False
    #: the resized pixels rounded to whole levels, as a uint8 resize returns them
    quantize: bool = False
    #: "cover" / "limit": each side of the network input is a multiple of this
    multiple: int = 1
    #: "topleft" / "center": the letterbox's padding level (0-255); grey 114 unless a family's
    #: reference pads otherwise (RT-DETRv2-OBB: black). Left out of the metadata at 114.
    pad: float = PAD_VALUE

    def __post_init__(self) -> None:
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"preprocess resize must be one of {RESIZE_MODES}, got {self.resize!r}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("preprocess mean and std must be given together")
        if self.mean is not None:
            if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
                raise ValueError(f"preprocess mean/std must be 3 values each (std > 0), got {self.mean}, {self.std}")
            object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
            object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if not 0 < float(self.crop_pct) <= 1:
            raise ValueError(f"preprocess crop_pct must be in (0, 1], got {self.crop_pct}")
        if self.interpolation not in ("bilinear", "bicubic"):
            raise ValueError(f"preprocess interpolation must be 'bilinear' or 'bicubic', got {self.interpolation!r}")
        if isinstance(self.multiple, bool) or not isinstance(self.multiple, int) or self.multiple < 1:
            raise ValueError(f"preprocess multiple must be an integer >= 1, got {self.multiple!r}")
        for k in ("antialias", "quantize"):
            if not isinstance(getattr(self, k), bool):
                raise ValueError(f"preprocess {k} must be True or False, got {getattr(self, k)!r}")
        if isinstance(self.pad, bool) or not isinstance(self.pad, (int, float)) or not 0 <= self.pad <= 255:
            raise ValueError(f"preprocess pad must be a level in [0, 255], got {self.pad!r}")
        object.__setattr__(self, "pad", float(self.pad))

    # ------------------------------------------------------------------ apply
    def __call__(self, images_u8: torch.Tensor, size: int) -> torch.Tensor:
        """(B, H, W, 3) uint8 RGB -> (B, 3, size, size) float network input (resized, normalized)."""
        return self.normalize(self.resize_images(images_u8, size))

    def to_input(self, images_u8: torch.Tensor, size: int, dtype: torch.dtype = torch.float32,
                 channels_last: bool = False) -> torch.Tensor:
        """:meth:`__call__` writing the network input in ``dtype`` and memory format directly (the
        half path: one (B, 3, size, size) half NHWC tensor, no float32 copy of the normalized
        batch). Resizing runs in float32 and normalization computes in float32 before rounding
        once to ``dtype``, so the result equals ``self(images_u8, size).to(dtype)`` exactly; with
        the defaults it *is* ``self(images_u8, size)``."""
        if dtype == torch.float32 and not channels_last:
            return self(images_u8, size)
        x = self.resize_images(images_u8, size)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        out = torch.empty(x.shape, dtype=dtype, device=x.device).contiguous(memory_format=fmt)
        if self.mean is None:
            return out.copy_(x)
        for i, (m, s) in enumerate(zip(self.mean, self.std)):
            torch.div(x[:, i:i + 1] - m, s, out=out[:, i:i + 1])
        return out

    def resize_images(self, images_u8: torch.Tensor, size: int) -> torch.Tensor:
        """(B, H, W, 3) uint8 RGB -> (B, 3, size, size) float32 RGB in [0, 1] ((B, 3, h', w') for
        the aspect-keeping rules: :meth:`input_hw`)."""
        if self.resize == "long":
            return resize_long_side(images_u8, size, self.interpolation, quantize=self.quantize)
        if self.resize in ("cover", "limit"):
            h, w = int(images_u8.shape[1]), int(images_u8.shape[2])
            return resize_to(images_u8, self.input_hw(h, w, size), self.interpolation,
                             antialias=self.antialias, quantize=self.quantize)
        if self.resize != "crop":
            return letterbox(images_u8, size, self.resize, antialias=self.antialias, quantize=self.quantize,
                             pad=self.pad)
        return resize_crop(images_u8, size, self.crop_pct, self.interpolation, antialias=self.antialias,
                           quantize=self.quantize)

    def input_hw(self, h: int, w: int, size: int) -> tuple[int, int]:
        """The network input's (height, width) for an (h, w) image at ``size``."""
        if self.resize == "long":
            return long_side_size(h, w, size)
        if self.resize == "cover":
            return cover_size(h, w, size, self.multiple)
        if self.resize == "limit":
            return limit_size(h, w, size, self.multiple)
        return size, size

    def batch(self, images_u8: list[torch.Tensor], size: int, prep=None) -> torch.Tensor:
        """One network batch from (1, H, W, 3) images of different sizes, each resized alone by
        ``prep`` (default: this preprocessing); a clear error where their inputs differ in size
        (the aspect-keeping rules)."""
        prep = self if prep is None else prep
        sizes = {self.input_hw(int(im.shape[1]), int(im.shape[2]), size) for im in images_u8}
        if len(sizes) > 1:
            raise ValueError(f"preprocess resize {self.resize!r} keeps each image's aspect ratio, so images of "
                             f"different sizes give network inputs of different sizes ({sorted(sizes)}) that "
                             "cannot share a batch: predict them with batch=1 or pass images of one size")
        return torch.cat([prep(im, size) for im in images_u8])

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """RGB [0, 1] batch -> the network's input: per channel ``(x - mean) / std``, or ``x``.

        Python scalars only (no tensor built from a list), so nothing is copied from the host
        while a CUDA graph is being captured.
        """
        if self.mean is None:
            return x
        chans = [(x[:, i:i + 1] - m) / s for i, (m, s) in enumerate(zip(self.mean, self.std))]
        return torch.cat(chans, 1)

    # ------------------------------------------------------------- metadata
    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("mean", "std"):
            if d[k] is not None:
                d[k] = list(d[k])
        if d["pad"] == PAD_VALUE:   # the shared grey: the metadata every other family has always written
            del d["pad"]
        return d

    @classmethod
    def from_meta(cls, meta: Any, default: Preprocess) -> Preprocess:
        """A checkpoint's ``preprocess`` entry (a dict) over ``default``; the legacy
        ``letterbox_pad`` key (LibreYOLO detection checkpoints) sets ``resize`` only."""
        if isinstance(meta, Preprocess):
            return meta
        if not isinstance(meta, dict):
            raise ValueError(f"checkpoint field 'preprocess' must be a dict, got {type(meta).__name__}")
        # every field of the dataclass, ``pad`` included: as_dict() leaves out the shared grey, so
        # filtering by its keys would drop a checkpoint's own pad (Darknet's 128)
        fields = {**asdict(default), **{k: v for k, v in meta.items() if k in asdict(default)}}
        for k in ("mean", "std"):
            if fields[k] is not None:
                fields[k] = tuple(fields[k])
        return cls(**fields)


def long_side_size(h: int, w: int, size: int) -> tuple[int, int]:
    """The (h', w') an (h, w) image is resized to by ``"long"``: longer side ``size``, the other
    ``int(side * size / longer + 0.5)`` (SAM's rounding)."""
    if h <= 0 or w <= 0:
        raise ValueError(f"cannot resize an empty image of size {h}x{w}")
    scale = size / max(h, w)
    return max(1, int(h * scale + 0.5)), max(1, int(w * scale + 0.5))


def _check_u8(images_u8: torch.Tensor, what: str) -> None:
    if images_u8.dim() != 4 or images_u8.shape[-1] != 3:
        raise ValueError(f"{what} expects (B, H, W, 3) images, got shape {tuple(images_u8.shape)}")
    if images_u8.dtype != torch.uint8:
        raise ValueError(f"{what} expects uint8 images, got {images_u8.dtype}")


def _levels(x: torch.Tensor, quantize: bool, clamp: bool) -> torch.Tensor:
    """Resized pixels as a uint8 resize returns them (``quantize``: rounded, then saturated), or
    clamped to [0, 255] only (``clamp``: bicubic overshoots), or as they are."""
    if quantize:
        return x.round().clamp(0, 255)
    return x.clamp(0, 255) if clamp else x


def resize_long_side(images_u8: torch.Tensor, size: int, interpolation: str = "bilinear", *,
                     quantize: bool = False) -> torch.Tensor:
    """(B, H, W, 3) uint8 RGB -> (B, 3, h', w') float32 in [0, 1] with the longer side ``size``
    (:func:`long_side_size`); antialiased when it shrinks."""
    _check_u8(images_u8, "resize_long_side")
    _, h, w, _ = images_u8.shape
    rh, rw = long_side_size(int(h), int(w), size)
    x = images_u8.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    if (rh, rw) != (h, w):
        x = F.interpolate(x, size=(rh, rw), mode=interpolation, align_corners=False, antialias=rh < h or rw < w)
    return _levels(x, quantize, interpolation == "bicubic").div(255.0)


def cover_size(h: int, w: int, size: int, multiple: int) -> tuple[int, int]:
    """The (h', w') of the "cover" rule: scale so that the shorter side reaches ``size``, each side
    rounded to the nearest multiple (halves to even), or the next one up where that falls below
    ``size`` (Depth Anything's ``lower_bound``, ``ensure_multiple_of``)."""
    if h <= 0 or w <= 0:
        raise ValueError(f"cannot resize an empty image of size {h}x{w}")
    scale = max(size / h, size / w)

    def side(x: float) -> int:
        y = round(x / multiple) * multiple
        return int(math.ceil(x / multiple) * multiple) if y < size else int(y)

    rh, rw = side(scale * h), side(scale * w)
    if max(rh, rw) > COVER_MAX_ASPECT * size:
        # the shorter side reaches size, so the longer one grows with the aspect ratio: a strip
        # image would need a network input (and attention over its tokens) beyond any memory
        raise ValueError(f"a {w}x{h} image (width x height) keeps its aspect ratio under this model's resize: "
                         f"its network input would be {rw}x{rh}, more than {COVER_MAX_ASPECT}:1; crop or pad "
                         "it nearer to square first")
    return rh, rw


#: the longest side the "cover" rule gives, in multiples of ``size`` (an aspect ratio of 8:1)
COVER_MAX_ASPECT = 8


#: PP-OCR's cap on either side after the "limit" rule's shrink
LIMIT_MAX_SIDE = 4000


def limit_size(h: int, w: int, size: int, multiple: int) -> tuple[int, int]:
    """The (h', w') of the "limit" rule: an image whose longer side exceeds ``size`` shrunk to it
    (sides truncated), none enlarged, each side then rounded to the nearest multiple (halves to
    even), at least one multiple (PP-OCR's ``DetResizeForTest``, ``limit_type="max"``)."""
    if h <= 0 or w <= 0:
        raise ValueError(f"cannot resize an empty image of size {h}x{w}")
    ratio = (size / h if h > w else size / w) if max(h, w) > size else 1.0
    rh, rw = int(h * ratio), int(w * ratio)
    if max(rh, rw) > LIMIT_MAX_SIDE:
        ratio = LIMIT_MAX_SIDE / max(rh, rw)
        rh, rw = int(rh * ratio), int(rw * ratio)
    return (max(int(round(rh / multiple) * multiple), multiple),
            max(int(round(rw / multiple) * multiple), multiple))


def resize_to(images_u8: torch.Tensor, hw: tuple[int, int], interpolation: str = "bilinear", *,
              antialias: bool = False, quantize: bool = False) -> torch.Tensor:
    """(B, H, W, 3) uint8 RGB -> (B, 3, h', w') float32 in [0, 1] at ``hw`` (no padding)."""
    _check_u8(images_u8, "resize_to")
    _, h, w, _ = images_u8.shape
    x = images_u8.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    if tuple(hw) != (h, w):
        x = F.interpolate(x, size=tuple(hw), mode=interpolation, align_corners=False, antialias=antialias)
    return _levels(x, quantize, False).div(255.0)


def crop_resize_size(h: int, w: int, size: int, crop_pct: float) -> tuple[int, int]:
    """The (h, w) an image is resized to before the centre crop: shorter side ``floor(size /
    crop_pct)``, the longer one scaled with it and truncated (torchvision's ``Resize(int)``)."""
    short = int(math.floor(size / crop_pct))
    if h <= w:
        return short, max(short, int(short * w / h))
    return max(short, int(short * h / w)), short


def crop_offsets(rh: int, rw: int, size: int) -> tuple[int, int]:
    """(top, left) of the centre ``size`` x ``size`` crop of an (rh, rw) image (torchvision's
    ``CenterCrop``: half the margin, rounded to even)."""
    return int(round((rh - size) / 2.0)), int(round((rw - size) / 2.0))


def resize_crop(images_u8: torch.Tensor, size: int, crop_pct: float = 0.875,
                interpolation: str = "bilinear", *, antialias: bool = False, quantize: bool = False) -> torch.Tensor:
    """(B, H, W, 3) uint8 RGB -> (B, 3, size, size) float32 in [0, 1]: shorter side to
    ``size / crop_pct`` (antialiased when shrinking, or always with ``antialias``: PIL's
    resampling), then the centre ``size`` x ``size``."""
    _check_u8(images_u8, "resize_crop")
    _, h, w, _ = images_u8.shape
    rh, rw = crop_resize_size(int(h), int(w), size, crop_pct)
    x = images_u8.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    if (rh, rw) != (h, w):
        x = F.interpolate(x, size=(rh, rw), mode=interpolation, align_corners=False,
                          antialias=antialias or rh < h or rw < w)
    top, left = crop_offsets(rh, rw, size)
    x = x[:, :, top:top + size, left:left + size]
    return _levels(x, quantize, interpolation == "bicubic").div(255.0)
