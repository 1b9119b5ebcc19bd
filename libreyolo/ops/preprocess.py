"""A family's preprocessing as data: how uint8 images become the network's input.

Each family declares one :class:`Preprocess` (``Model.PREPROCESS``), as timm's ``pretrained_cfg``
or torchvision's weight transforms do, and a checkpoint may carry its own (metadata key
``preprocess``). The same object drives predict (on the GPU, inside the captured stage),
validation and training (the datasets resize as predict does; the trainer normalizes the batch
as predict does), so the three can never disagree.

``resize``:

* ``"topleft"`` / ``"center"``: letterbox (keep the aspect ratio, pad with grey 114) with the image
  at the top-left corner or centred;
* ``"stretch"``: resize to the square ignoring the aspect ratio;
* ``"crop"``: resize the shorter side to ``size / crop_pct`` keeping the aspect ratio, then crop
  the centre ``size`` x ``size`` (the ImageNet evaluation transform);
* ``"long"``: resize the longer side to ``size`` keeping the aspect ratio and pad nothing: the
  batch is (B, 3, h', w') with max(h', w') = ``size`` (SAM's transform: the network normalizes and
  zero-pads to its square itself); antialiased when it shrinks, as SAM's PIL resize is.

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
from .letterbox import letterbox

RESIZE_MODES = (*LETTERBOX_MODES, "crop", "long")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocess:
    """How images reach a family's network (see the module docstring)."""

    resize: str = "topleft"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    crop_pct: float = 1.0
    #: ``"bilinear"`` or ``"bicubic"``; "crop" resizing also antialiases when it shrinks
    interpolation: str = "bilinear"

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
        """(B, H, W, 3) uint8 RGB -> (B, 3, size, size) float32 RGB in [0, 1]."""
        if self.resize == "long":
            return resize_long_side(images_u8, size, self.interpolation)
        if self.resize != "crop":
            return letterbox(images_u8, size, self.resize)
        return resize_crop(images_u8, size, self.crop_pct, self.interpolation)

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
        return d

    @classmethod
    def from_meta(cls, meta: Any, default: "Preprocess") -> "Preprocess":
        """A checkpoint's ``preprocess`` entry (a dict) over ``default``; the legacy
        ``letterbox_pad`` key (LibreYOLO detection checkpoints) sets ``resize`` only."""
        if isinstance(meta, Preprocess):
            return meta
        if not isinstance(meta, dict):
            raise ValueError(f"checkpoint field 'preprocess' must be a dict, got {type(meta).__name__}")
        fields = {**default.as_dict(), **{k: v for k, v in meta.items() if k in default.as_dict()}}
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


def resize_long_side(images_u8: torch.Tensor, size: int, interpolation: str = "bilinear") -> torch.Tensor:
    """(B, H, W, 3) uint8 RGB -> (B, 3, h', w') float32 in [0, 1] with the longer side ``size``
    (:func:`long_side_size`); antialiased when it shrinks."""
    if images_u8.dim() != 4 or images_u8.shape[-1] != 3:
        raise ValueError(f"resize_long_side expects (B, H, W, 3) images, got shape {tuple(images_u8.shape)}")
    if images_u8.dtype != torch.uint8:
        raise ValueError(f"resize_long_side expects uint8 images, got {images_u8.dtype}")
    _, h, w, _ = images_u8.shape
    rh, rw = long_side_size(int(h), int(w), size)
    x = images_u8.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    if (rh, rw) != (h, w):
        x = F.interpolate(x, size=(rh, rw), mode=interpolation, align_corners=False, antialias=rh < h or rw < w)
    if interpolation == "bicubic":  # bicubic overshoots the [0, 255] range
        x = x.clamp(0, 255)
    return x.div(255.0)


def crop_resize_size(h: int, w: int, size: int, crop_pct: float) -> tuple[int, int]:
    """The (h, w) an image is resized to before the centre crop: shorter side ``size / crop_pct``."""
    short = int(math.floor(size / crop_pct))
    if h <= w:
        return short, max(short, int(round(w * short / h)))
    return max(short, int(round(h * short / w))), short


def resize_crop(images_u8: torch.Tensor, size: int, crop_pct: float = 0.875,
                interpolation: str = "bilinear") -> torch.Tensor:
    """(B, H, W, 3) uint8 RGB -> (B, 3, size, size) float32 in [0, 1]: shorter side to
    ``size / crop_pct`` (antialiased when shrinking), then the centre ``size`` x ``size``."""
    if images_u8.dim() != 4 or images_u8.shape[-1] != 3:
        raise ValueError(f"resize_crop expects (B, H, W, 3) images, got shape {tuple(images_u8.shape)}")
    if images_u8.dtype != torch.uint8:
        raise ValueError(f"resize_crop expects uint8 images, got {images_u8.dtype}")
    _, h, w, _ = images_u8.shape
    rh, rw = crop_resize_size(int(h), int(w), size, crop_pct)
    x = images_u8.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    if (rh, rw) != (h, w):
        x = F.interpolate(x, size=(rh, rw), mode=interpolation, align_corners=False,
                          antialias=rh < h or rw < w)
    top, left = (rh - size) // 2, (rw - size) // 2
    x = x[:, :, top:top + size, left:left + size]
    if interpolation == "bicubic":  # bicubic overshoots the [0, 255] range
        x = x.clamp(0, 255)
    return x.div(255.0)
