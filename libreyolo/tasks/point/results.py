"""Points of one image (the point task's Results field, ``Results.points``)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ...results import DataRows

__all__ = ["Points"]


class Points(DataRows):
    """Object centres found in one image: ``data`` is (n, 4) ``x, y, conf, cls`` in original-image
    pixels, best first (a torch tensor on any device, or a numpy array after :meth:`numpy`).

    ``orig_shape`` is the (height, width) of the image. :meth:`plot_on` draws each point as a dot
    in its class's palette colour; :meth:`summary` gives one dict per point.
    """

    def __init__(self, data: torch.Tensor | np.ndarray, orig_shape: tuple[int, int]):
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise TypeError(f"Points data must be a torch tensor or numpy array, got {type(data).__name__}")
        if data.ndim != 2 or data.shape[1] != 4:
            raise ValueError(f"Points data must have shape (n, 4) = x, y, conf, cls; got {tuple(data.shape)}")
        self._data = data
        self.orig_shape = (int(orig_shape[0]), int(orig_shape[1]))

    @property
    def data(self) -> torch.Tensor | np.ndarray:
        """The (n, 4) array: x, y, conf, cls."""
        return self._data

    @property
    def xy(self) -> torch.Tensor | np.ndarray:
        """(n, 2) point coordinates in pixels."""
        return self._data[:, :2]

    @property
    def xyn(self) -> torch.Tensor | np.ndarray:
        """(n, 2) point coordinates divided by the image width / height."""
        h, w = self.orig_shape
        xy = self._data[:, :2]
        scale = torch.tensor([w, h], dtype=xy.dtype, device=xy.device) if isinstance(xy, torch.Tensor) \
            else np.array([w, h], dtype=xy.dtype)
        return xy / scale

    @property
    def conf(self) -> torch.Tensor | np.ndarray:
        """(n,) confidences (the class's probability in the point's cell)."""
        return self._data[:, 2]

    @property
    def cls(self) -> torch.Tensor | np.ndarray:
        """(n,) class indices (as floats, like ``Boxes.cls``)."""
        return self._data[:, 3]

    def __getitem__(self, index: Any) -> Points:
        data = self._data[index]
        if data.ndim == 1:
            data = data[None]
        return Points(data, self.orig_shape)

    def __repr__(self) -> str:
        return f"Points(n={len(self)}, orig_shape={self.orig_shape})"

    def _new(self, data: Any) -> Points:
        return Points(data, self.orig_shape)

    def _rows(self) -> np.ndarray:
        d = self._data
        if isinstance(d, torch.Tensor):
            d = d.detach().float().cpu().numpy()
        return np.asarray(d, dtype=np.float64)

    def summary(self, names: dict[int, str], decimals: int = 5, normalize: bool = False) -> list[dict]:
        """One dict per point: name, class, confidence and ``point`` {x, y} (pixels, or divided
        by the image size with ``normalize``)."""
        h, w = self.orig_shape
        out = []
        for x, y, c, k in self._rows():
            if normalize:
                x, y = x / w, y / h
            out.append({"name": names.get(int(k), str(int(k))), "class": int(k),
                        "confidence": round(float(c), decimals),
                        "point": {"x": round(float(x), decimals), "y": round(float(y), decimals)}})
        return out

    def plot_on(self, image: np.ndarray, names: dict[int, str]) -> np.ndarray:
        """Each point drawn on a copy of ``image`` (HxWx3 uint8) as a filled dot in its class's
        colour, ringed in white so that it shows on any background."""
        from ...results import class_color
        h, w = image.shape[:2]
        radius = max(3, round((h + w) / 2 * 0.008))
        pil = Image.fromarray(image)
        draw = ImageDraw.Draw(pil)
        for x, y, _, k in self._rows():
            if not (np.isfinite(x) and np.isfinite(y)):
                continue
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=class_color(int(k)),
                         outline=(255, 255, 255), width=max(1, radius // 3))
        return np.array(pil, dtype=np.uint8)
