"""Oriented boxes of one image (the obb task's Results field)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ...results import DataRows
from .rotated import xywhr_to_corners


class OBB(DataRows):
    """Rotated boxes: ``data`` (n, 7) rows ``[cx, cy, w, h, angle, conf, cls]`` in original-image
    pixels, the angle in radians (the width side turned from the x axis, clockwise on screen).

    ``.xywhr`` (n, 5), ``.xyxyxyxy`` (n, 4, 2) corners, ``.xyxy`` the enclosing axis-aligned boxes,
    ``.conf``, ``.cls``; ``orig_shape`` is the image's (height, width).
    """

    def __init__(self, data: torch.Tensor | np.ndarray, orig_shape: tuple[int, int]):
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise TypeError(f"OBB data must be a torch tensor or numpy array, got {type(data).__name__}")
        if data.ndim != 2 or data.shape[1] != 7:
            raise ValueError(f"OBB data must have shape (n, 7) = cx, cy, w, h, angle, conf, cls; got "
                             f"{tuple(data.shape)}")
        self._data = data
        self.orig_shape = (int(orig_shape[0]), int(orig_shape[1]))

    @property
    def data(self) -> torch.Tensor | np.ndarray:
        return self._data

    @property
    def xywhr(self) -> torch.Tensor | np.ndarray:
        """(n, 5) centre, width, height, angle (radians)."""
        return self._data[:, :5]

    @property
    def conf(self) -> torch.Tensor | np.ndarray:
        return self._data[:, 5]

    @property
    def cls(self) -> torch.Tensor | np.ndarray:
        return self._data[:, 6]

    @property
    def xyxyxyxy(self) -> torch.Tensor | np.ndarray:
        """(n, 4, 2) corner points in pixels."""
        d = self._data[:, :5]
        if isinstance(d, np.ndarray):
            return xywhr_to_corners(torch.from_numpy(d)).numpy()
        return xywhr_to_corners(d)

    @property
    def xyxyxyxyn(self) -> torch.Tensor | np.ndarray:
        """(n, 4, 2) corner points divided by the image width / height."""
        h, w = self.orig_shape
        pts = self.xyxyxyxy
        scale = torch.tensor([w, h], dtype=pts.dtype, device=pts.device) if isinstance(pts, torch.Tensor) \
            else np.array([w, h], dtype=pts.dtype)
        return pts / scale

    @property
    def xyxy(self) -> torch.Tensor | np.ndarray:
        """(n, 4) the axis-aligned boxes enclosing the rotated ones."""
        pts = self.xyxyxyxy
        if isinstance(pts, torch.Tensor):
            return torch.cat((pts.amin(1), pts.amax(1)), 1)
        return np.concatenate((pts.min(1), pts.max(1)), 1)

    def __getitem__(self, index: Any) -> OBB:
        data = self._data[index]
        if data.ndim == 1:
            data = data[None]
        return OBB(data, self.orig_shape)

    def __repr__(self) -> str:
        return f"OBB(n={len(self)}, orig_shape={self.orig_shape})"

    def _new(self, data: Any) -> OBB:
        return OBB(data, self.orig_shape)

    def _rows(self) -> np.ndarray:
        d = self._data
        if isinstance(d, torch.Tensor):
            d = d.detach().double().cpu().numpy()
        return np.asarray(d, dtype=np.float64)

    def summary(self, names: dict[int, str], decimals: int = 5) -> list[dict]:
        """One dict per box: name, class, confidence, ``box`` (cx, cy, w, h, angle in radians) and
        ``corners`` ([[x, y] * 4]), as plain numbers."""
        rows = self._rows()
        corners = xywhr_to_corners(torch.from_numpy(rows[:, :5])).numpy() if len(rows) else np.zeros((0, 4, 2))
        out = []
        for (cx, cy, w, h, a, conf, c), pts in zip(rows, corners):
            out.append({"name": names.get(int(c), str(int(c))), "class": int(c),
                        "confidence": round(float(conf), decimals),
                        "box": {k: round(float(v), decimals) for k, v in
                                zip(("cx", "cy", "w", "h", "angle"), (cx, cy, w, h, a))},
                        "corners": [[round(float(x), decimals), round(float(y), decimals)] for x, y in pts]})
        return out

    def plot_on(self, image: np.ndarray, names: dict[int, str]) -> np.ndarray:
        """The rotated boxes (outlines in their class colour) with a label at their first corner,
        drawn on a copy of ``image`` (HxWx3 uint8)."""
        from ...results import class_color
        h, w = image.shape[:2]
        width = max(1, round((h + w) / 2 * 0.003))
        pil = Image.fromarray(image)
        draw = ImageDraw.Draw(pil)
        rows = self._rows()
        corners = xywhr_to_corners(torch.from_numpy(rows[:, :5])).numpy() if len(rows) else []
        for row, pts in zip(rows, corners):
            c = int(row[6])
            color = class_color(c)
            poly = [(float(x), float(y)) for x, y in pts]
            draw.line(poly + [poly[0]], fill=color, width=width)
            label = f"{names.get(c, str(c))} {row[5]:.2f}"
            x, y = min(poly, key=lambda p: (p[1], p[0]))
            tw = draw.textlength(label)
            draw.rectangle((x, max(0.0, y - 12), x + tw + 4, max(12.0, y)), fill=color)
            draw.text((x + 2, max(0.0, y - 12)), label, fill=(255, 255, 255))
        return np.asarray(pil)
