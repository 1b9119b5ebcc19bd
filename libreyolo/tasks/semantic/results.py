"""The semantic-segmentation result of one image: :class:`SemanticMask` (``Results.masks``)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ...results import PixelMap, class_color, load_font

__all__ = ["SemanticMask"]


class SemanticMask(PixelMap):
    """Per-pixel classes of one image: ``data`` is the (H, W) class map at the original image's
    resolution (an integer torch tensor on any device, or a numpy array after :meth:`numpy`).

    ``counts`` / ``areas``: pixels / fraction of the image per class present (class id ->
    number, largest first); :meth:`plot_on` draws a colour overlay with a legend, :meth:`summary`
    lists the classes present with their area.
    """

    WHAT = "class map"

    def __init__(self, data: torch.Tensor | np.ndarray):
        super().__init__(data)
        self._counts: dict[int, int] | None = None

    def _check_dtype(self, data: torch.Tensor | np.ndarray) -> None:
        is_int = (not data.dtype.is_floating_point and data.dtype != torch.bool) if isinstance(data, torch.Tensor) \
            else data.dtype.kind in "iu"
        if not is_int:
            raise ValueError(f"SemanticMask data must hold integer class ids, got dtype {data.dtype}")

    @property
    def counts(self) -> dict[int, int]:
        """Pixels per class present (class id -> count), largest first (ties: lower id first)."""
        if self._counts is None:
            d = self._data
            if isinstance(d, torch.Tensor):
                c = torch.bincount(d.reshape(-1).to(torch.int64)).cpu().numpy()
            else:
                c = np.bincount(d.reshape(-1).astype(np.int64, copy=False))
            present = np.flatnonzero(c)
            order = present[np.lexsort((present, -c[present]))]
            self._counts = {int(k): int(c[k]) for k in order}
        return dict(self._counts)

    @property
    def areas(self) -> dict[int, float]:
        """Fraction of the image per class present (class id -> fraction; they sum to 1)."""
        total = max(1, self.shape[0] * self.shape[1])
        return {k: n / total for k, n in self.counts.items()}

    def _host(self) -> np.ndarray:
        d = self._data
        return d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else np.asarray(d)

    def __repr__(self) -> str:
        where = f"tensor on {self._data.device}" if isinstance(self._data, torch.Tensor) else "numpy"
        return f"SemanticMask(shape={self.shape}, classes={len(self.counts)}, {where}, dtype={self._data.dtype})"

    # ---- user-facing outputs -------------------------------------------------------------------
    def summary(self, names: dict[int, str], decimals: int = 5) -> list[dict[str, Any]]:
        """One dict per class present, largest area first: name, class, area (fraction of the image)."""
        return [{"name": names.get(c, str(c)), "class": c, "area": round(a, decimals)}
                for c, a in self.areas.items()]

    def plot_on(self, image: np.ndarray, names: dict[int, str], alpha: float = 0.5,
                legend: bool = True) -> np.ndarray:
        """``image`` (HxWx3 uint8 RGB, the map's size) blended with each pixel's class colour
        (``libreyolo.results.class_color``, weight ``alpha``), and a legend of the classes present
        (colour swatch + name, largest area first) in the top-left corner."""
        labels = self._host()
        if tuple(image.shape[:2]) != labels.shape:
            raise ValueError(f"image of shape {tuple(image.shape)} does not match the class map {labels.shape}")
        lut = np.array([class_color(k) for k in range(int(labels.max()) + 1)], dtype=np.float32)
        blended = image.astype(np.float32) * (1.0 - alpha) + lut[labels] * alpha
        out = np.clip(np.rint(blended), 0, 255).astype(np.uint8)
        if not legend:
            return out
        return _draw_legend(out, [(c, names.get(c, str(c)), a) for c, a in self.areas.items()])


def _draw_legend(image: np.ndarray, rows: list[tuple[int, str, float]]) -> np.ndarray:
    """Swatch + "name 42%" rows on a dark panel in the top-left corner; rows that do not fit the
    image's height are summarised as "+N more"."""
    h, w = image.shape[:2]
    fs = max(10, round((h + w) / 2 * 0.03))
    font = load_font(fs)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    line = font.getbbox("Agy|")[3] + 4
    pad = 3
    fit = max(1, (h - 2 * pad) // line)
    if len(rows) > fit:
        shown = rows[:max(0, fit - 1)]
        texts = [f"{n} {a:.0%}" for _, n, a in shown] + [f"+{len(rows) - len(shown)} more"]
    else:
        shown = rows
        texts = [f"{n} {a:.0%}" for _, n, a in shown]
    sw = line - 4   # swatch side
    width = pad * 3 + sw + max(int(draw.textlength(t, font=font)) for t in texts)
    draw.rectangle((0, 0, min(w - 1, width), min(h - 1, pad * 2 + line * len(texts) - 1)), fill=(20, 20, 20))
    for i, text in enumerate(texts):
        y = pad + i * line
        if i < len(shown):
            draw.rectangle((pad, y + 2, pad + sw - 1, y + 2 + sw - 1), fill=class_color(shown[i][0]),
                           outline=(255, 255, 255))
        draw.text((pad * 2 + sw, y), text, fill=(255, 255, 255), font=font)
    return np.array(pil, dtype=np.uint8)
