"""The depth result of one image: :class:`DepthMap` (``Results.depth``)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ...atomic import atomic_write
from ...results import PixelMap, load_font

__all__ = ["DepthMap", "DEFAULT_CMAP", "colormap_lut"]

#: the colour map of :meth:`DepthMap.plot_on` (Depth Anything's own demo uses it: near = red)
DEFAULT_CMAP = "Spectral_r"
#: raw-map formats :meth:`DepthMap.save` writes, by suffix
RAW_SUFFIXES = (".npy", ".png", ".tif", ".tiff")

log = logging.getLogger(__name__)
_said_constant: set[str] = set()   # a constant map is explained once per process (not per video frame)


def colormap_lut(cmap: str) -> np.ndarray:
    """(256, 3) uint8 RGB table of the matplotlib colour map ``cmap`` (low values first)."""
    import matplotlib
    try:
        cm = matplotlib.colormaps[cmap]
    except KeyError:
        raise ValueError(f"unknown matplotlib colour map {cmap!r} (e.g. 'Spectral_r', 'inferno', 'magma', "
                         f"'viridis', 'gray')") from None
    return np.rint(cm(np.linspace(0.0, 1.0, 256))[:, :3] * 255).astype(np.uint8)


class DepthMap(PixelMap):
    """Relative depth of one image: ``data`` is the (H, W) float map at the original image's
    resolution (a torch tensor on any device, or a numpy array after :meth:`numpy`).

    Depth Anything predicts relative *inverse* depth (disparity-like): larger is nearer, the
    scale and shift are unknown (no metres). ``min`` / ``max`` / ``mean`` summarise it;
    :meth:`colorize` maps it through a matplotlib colour map, :meth:`plot_on` adds a colour bar,
    :meth:`save` writes the raw map (``.npy`` / ``.tif``: float32 as predicted; ``.png``: 16-bit,
    the map's min..max stretched to 0..65535).
    """

    def _check_dtype(self, data: torch.Tensor | np.ndarray) -> None:
        if not self._is_float(data):
            raise ValueError(f"DepthMap data must be floating point, got dtype {data.dtype}")

    def _host(self) -> np.ndarray:
        d = self._data
        return (d.detach().float().cpu().numpy() if isinstance(d, torch.Tensor) else np.asarray(d)).astype(
            np.float32, copy=False)

    @property
    def min(self) -> float:
        return float(self._data.min())

    @property
    def max(self) -> float:
        return float(self._data.max())

    @property
    def mean(self) -> float:
        return float(self._data.float().mean() if isinstance(self._data, torch.Tensor) else self._data.mean())

    def __repr__(self) -> str:
        where = f"tensor on {self._data.device}" if isinstance(self._data, torch.Tensor) else "numpy"
        return f"DepthMap(shape={self.shape}, min={self.min:.4g}, max={self.max:.4g}, {where}, dtype={self._data.dtype})"

    # ---- user-facing outputs -------------------------------------------------------------------
    def summary(self, names: dict[int, str] | None = None, decimals: int = 5) -> dict[str, Any]:
        """The map's size and value range (relative inverse depth: larger is nearer)."""
        return {"shape": list(self.shape), "min": round(self.min, decimals), "max": round(self.max, decimals),
                "mean": round(self.mean, decimals), "kind": "relative inverse depth"}

    def normalized(self) -> np.ndarray:
        """The map stretched to [0, 1] (its min -> 0, its max -> 1; a constant map -> 0), float32."""
        d = self._host()
        lo, hi = float(d.min()), float(d.max())
        if not np.isfinite(lo) or not np.isfinite(hi):
            raise ValueError("the depth map holds non-finite values (NaN or inf); it cannot be shown or stretched")
        return ((d - lo) / (hi - lo) if hi > lo else np.zeros_like(d)).astype(np.float32, copy=False)

    def colorize(self, cmap: str = DEFAULT_CMAP) -> np.ndarray:
        """HxWx3 uint8 RGB: the map's min..max through the colour map ``cmap`` (nearest = top of the map)."""
        lut = colormap_lut(cmap)
        return lut[np.rint(self.normalized() * 255).astype(np.uint8)]

    def plot_on(self, image: np.ndarray, names: dict[int, str] | None = None, cmap: str = DEFAULT_CMAP,
                colorbar: bool = True) -> np.ndarray:
        """The colour-mapped depth (the picture of ``image``'s size, whose pixels it replaces) with
        a colour bar on the right: the colour scale from the nearest value (top) to the farthest
        (bottom), labelled with the map's max / mid / min values."""
        if tuple(image.shape[:2]) != self.shape:
            raise ValueError(f"image of shape {tuple(image.shape)} does not match the depth map {self.shape}")
        lo, hi = self.min, self.max
        if lo == hi and "constant" not in _said_constant:
            _said_constant.add("constant")
            log.warning("the depth map is the same value (%.3g) everywhere, so the picture is one colour and its "
                        "colour bar reads %.3g throughout%s", lo, lo,
                        ": an untrained depth model's head (it ends in a ReLU) often outputs 0 everywhere; train "
                        "it or load trained weights" if lo == 0 else "")
        picture = self.colorize(cmap)
        if not colorbar:
            return picture
        return _with_colorbar(picture, colormap_lut(cmap), lo, hi)

    def save(self, path: str | os.PathLike) -> str:
        """Write the raw map: ``.npy`` (float32 numpy array), ``.tif`` / ``.tiff`` (float32 TIFF) or
        ``.png`` (16-bit grayscale, min..max stretched to 0..65535: the range is not kept).
        Written atomically (temporary file, then renamed); returns the path."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in RAW_SUFFIXES:
            raise ValueError(f"cannot save the depth map as '{path}': use one of {', '.join(RAW_SUFFIXES)} "
                             f"(Results.save writes the colour-mapped picture)")
        with atomic_write(path, what="save the depth map") as f:
            if suffix == ".npy":
                np.save(f, self._host())
            elif suffix == ".png":
                u16 = np.rint(self.normalized() * 65535).astype(np.uint16)
                Image.fromarray(u16).save(f, format="PNG")
            else:
                Image.fromarray(self._host(), mode="F").save(f, format="TIFF")
        return str(path)


def _with_colorbar(picture: np.ndarray, lut: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``picture`` with a dark panel on its right: a vertical colour strip (``lut``'s top colour
    at the top) and the values ``hi`` / mid / ``lo`` beside it."""
    h, w = picture.shape[:2]
    fs = max(9, round(min(h, max(w, h)) * 0.03))
    font = load_font(fs)
    labels = [f"{v:.3g}" for v in (hi, (hi + lo) / 2, lo)]
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    text_w = max(int(probe.textlength(t, font=font)) for t in labels)
    pad = max(3, fs // 3)
    strip = max(8, round(w * 0.03))
    panel_w = pad * 3 + strip + text_w
    canvas = Image.new("RGB", (w + panel_w, h), (20, 20, 20))
    canvas.paste(Image.fromarray(picture), (0, 0))
    top, bottom = pad + fs // 2, max(pad + fs // 2 + 1, h - pad - fs // 2)
    n = bottom - top
    ramp = lut[np.rint(np.linspace(255, 0, n)).astype(np.intp)]          # nearest (max) at the top
    canvas.paste(Image.fromarray(np.repeat(ramp[:, None, :], strip, axis=1)), (w + pad, top))
    draw = ImageDraw.Draw(canvas)
    x_text = w + pad * 2 + strip
    half = font.getbbox("0")[3] // 2
    for text, y in zip(labels, (top, top + n // 2, bottom - 1)):
        draw.text((x_text, max(0, y - half)), text, fill=(255, 255, 255), font=font)
    return np.array(canvas, dtype=np.uint8)
