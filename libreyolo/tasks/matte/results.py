"""The matting result of one image: :class:`Alpha` (``Results.alpha``)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...results import PixelMap

__all__ = ["Alpha", "checkerboard"]


def checkerboard(h: int, w: int, cell: int | None = None) -> np.ndarray:
    """(h, w, 3) uint8 light/dark grey checkerboard, the usual picture of "transparent"; ``cell``
    defaults to about 1/40 of the image's mean side (at least 4 pixels)."""
    cell = int(cell) if cell else max(4, round((h + w) / 2 / 40))
    yy, xx = np.ogrid[:h, :w]
    dark = ((yy // cell) + (xx // cell)) % 2 == 1
    out = np.full((h, w, 3), 204, dtype=np.uint8)
    out[dark] = 153
    return out


class Alpha(PixelMap):
    """Foreground opacity of one image: ``data`` is the (H, W) alpha in [0, 1] at the original
    image's resolution (a float torch tensor on any device, or a numpy array after :meth:`numpy`).

    :meth:`mask` thresholds it, :meth:`rgba` makes the cut-out (the image with the alpha as its
    fourth channel: what ``Results.save`` writes, as PNG), :meth:`plot_on` the cut-out over a
    checkerboard (what ``Results.plot`` shows), :meth:`summary` the foreground fraction.
    """

    def _check_dtype(self, data: torch.Tensor | np.ndarray) -> None:
        if not self._is_float(data):
            raise ValueError(f"Alpha data must be floating point in [0, 1], got dtype {data.dtype}")

    def mask(self, threshold: float = 0.5) -> torch.Tensor | np.ndarray:
        """(H, W) bool foreground map: alpha > ``threshold``."""
        if not 0.0 <= float(threshold) < 1.0:
            raise ValueError(f"threshold must be in [0, 1), got {threshold}")
        return self._data > float(threshold)

    def _host(self) -> np.ndarray:
        d = self._data
        d = d.detach().float().cpu().numpy() if isinstance(d, torch.Tensor) else np.asarray(d, dtype=np.float32)
        return d

    def __repr__(self) -> str:
        where = f"tensor on {self._data.device}" if isinstance(self._data, torch.Tensor) else "numpy"
        return f"Alpha(shape={self.shape}, {where}, dtype={self._data.dtype})"

    # ---- user-facing outputs -------------------------------------------------------------------
    def summary(self, names: dict[int, str], decimals: int = 5) -> dict[str, Any]:
        """Plain numbers: the image size, the mean alpha and the fraction of pixels above 0.5."""
        a = self._host()
        return {"shape": list(self.shape), "mean_alpha": round(float(a.mean()), decimals) if a.size else 0.0,
                "foreground": round(float((a > 0.5).mean()), decimals) if a.size else 0.0}

    def _check(self, image: np.ndarray) -> np.ndarray:
        if tuple(image.shape[:2]) != self.shape:
            raise ValueError(f"image of shape {tuple(image.shape)} does not match the alpha {self.shape}")
        return self._host()

    def rgba(self, image: np.ndarray) -> np.ndarray:
        """(H, W, 4) uint8: ``image`` (HxWx3 uint8 RGB) with the alpha (x 255, rounded) as its
        fourth channel."""
        a = self._check(image)
        alpha = np.clip(np.rint(a * 255.0), 0, 255).astype(np.uint8)
        return np.concatenate((image[..., :3], alpha[..., None]), axis=-1)

    def plot_on(self, image: np.ndarray, names: dict[int, str]) -> np.ndarray:
        """The cut-out composited over a checkerboard: ``alpha * image + (1 - alpha) * board``."""
        a = self._check(image)[..., None]
        board = checkerboard(*self.shape).astype(np.float32)
        out = image.astype(np.float32) * a + board * (1.0 - a)
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
