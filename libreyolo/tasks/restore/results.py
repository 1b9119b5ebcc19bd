"""The restoration result of one image: :class:`RestoredImage` (``Results.image``)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

__all__ = ["RestoredImage", "side_by_side"]


def side_by_side(before: np.ndarray, after: np.ndarray, gap: int = 4) -> np.ndarray:
    """(H', W', 3) uint8: ``before`` enlarged to ``after``'s size by pixel repetition (nearest, so
    every input pixel stays visible as a block), a white ``gap``, then ``after``."""
    h, w = after.shape[:2]
    bh, bw = before.shape[:2]
    if (bh, bw) != (h, w):
        ys = np.minimum((np.arange(h) * bh) // h, bh - 1)
        xs = np.minimum((np.arange(w) * bw) // w, bw - 1)
        before = before[ys][:, xs]
    sep = np.full((h, gap, 3), 255, dtype=np.uint8)
    return np.concatenate((before[..., :3], sep, after[..., :3]), axis=1)


class RestoredImage:
    """The restored picture of one image: ``data`` is (H * scale, W * scale, 3) uint8 RGB (a torch
    tensor on any device, or a numpy array after :meth:`numpy`), ``scale`` the output pixels per
    input pixel (1: same-size restoration; 2, 4: super-resolution).

    :meth:`save` writes the picture itself (what ``Results.save`` and ``predict(save=True)`` write),
    :meth:`plot_on` puts the input beside it (what ``Results.plot`` shows), :attr:`array` is the
    numpy picture, :meth:`summary` its size and scale.
    """

    #: ``Results.save`` writes this field's own picture (not :meth:`plot_on`'s)
    SAVES_ITSELF = True

    def __init__(self, data: torch.Tensor | np.ndarray, scale: int = 1):
        if data.ndim != 3 or data.shape[-1] != 3:
            raise ValueError(f"RestoredImage data must be (H, W, 3) RGB, got shape {tuple(data.shape)}")
        if data.dtype not in (torch.uint8, np.uint8):
            raise ValueError(f"RestoredImage data must be uint8, got dtype {data.dtype}")
        self._data = data
        self.scale = int(scale)

    @property
    def data(self) -> torch.Tensor | np.ndarray:
        return self._data

    @property
    def shape(self) -> tuple[int, int]:
        """(height, width) of the restored picture."""
        return int(self._data.shape[0]), int(self._data.shape[1])

    @property
    def array(self) -> np.ndarray:
        """The picture as an (H, W, 3) uint8 numpy array (on the host)."""
        d = self._data
        return d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else np.asarray(d)

    def cpu(self) -> RestoredImage:
        return RestoredImage(self._data.cpu() if isinstance(self._data, torch.Tensor) else self._data, self.scale)

    def numpy(self) -> RestoredImage:
        return RestoredImage(self.array, self.scale)

    def to(self, *args: Any, **kwargs: Any) -> RestoredImage:
        d = self._data if isinstance(self._data, torch.Tensor) else torch.from_numpy(self._data)
        out = d.to(*args, **kwargs)
        if out.dtype != torch.uint8:
            raise ValueError(f"a RestoredImage stays uint8; to() asked for {out.dtype}")
        return RestoredImage(out, self.scale)

    def __repr__(self) -> str:
        where = f"tensor on {self._data.device}" if isinstance(self._data, torch.Tensor) else "numpy"
        return f"RestoredImage(shape={self.shape}, scale={self.scale}, {where})"

    # ---- user-facing outputs -------------------------------------------------------------------
    def summary(self, names: dict[int, str] | None = None, decimals: int = 5) -> dict[str, Any]:
        """Plain numbers: the restored picture's size (height, width) and the scale."""
        return {"shape": list(self.shape), "scale": self.scale}

    def plot_on(self, image: np.ndarray, names: dict[int, str] | None = None) -> np.ndarray:
        """The input ``image`` (enlarged by pixel repetition to the output's size) and the restored
        picture side by side, with a white gap between them."""
        return side_by_side(image, self.array)

    def save(self, filename: str | os.PathLike) -> str:
        """Write the restored picture (the format follows the suffix: .png keeps it exactly) and
        return the path; atomic, as ``Results.save``."""
        from ...atomic import atomic_write
        path = Path(filename)
        fmt = Image.registered_extensions().get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"cannot save '{path}': unknown image format for suffix '{path.suffix}'")
        options = {"quality": 95} if fmt == "JPEG" else {}
        with atomic_write(path, what="save") as f:
            Image.fromarray(self.array).save(f, format=fmt, **options)
        return str(path)
