"""The instance masks of one image: :class:`InstanceMasks` (``Results.masks`` beside the boxes)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...results import class_color

__all__ = ["InstanceMasks"]


class InstanceMasks:
    """One bitmap per detected instance, in the order of ``Results.boxes``: ``data`` is the
    (n, H, W) bool stack at the original image's size (a torch tensor on any device, or a numpy
    array after :meth:`numpy`); ``cls`` the (n,) class of each, for the drawing colours.

    ``areas``: pixels per instance; ``xy``: each instance's outer polygons in pixels (a list
    per instance of (k, 2) float arrays, the largest first); ``xyn``: the same divided by the
    image's width and height.
    """

    def __init__(self, data: torch.Tensor | np.ndarray, cls: torch.Tensor | np.ndarray | None = None):
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise TypeError(f"InstanceMasks data must be a torch tensor or numpy array, got {type(data).__name__}")
        if data.ndim != 3:
            raise ValueError(f"InstanceMasks data must be an (n, H, W) stack of bitmaps, got shape {tuple(data.shape)}")
        if data.dtype not in (torch.bool, np.bool_):
            raise ValueError(f"InstanceMasks data must be bool bitmaps, got dtype {data.dtype}")
        n = data.shape[0]
        if cls is None:
            cls = np.zeros(n, np.int64)
        if len(cls) != n:
            raise ValueError(f"InstanceMasks cls must hold one class per mask ({n}), got {len(cls)}")
        self._data, self._cls = data, cls
        self._xy: list[list[np.ndarray]] | None = None

    @property
    def data(self) -> torch.Tensor | np.ndarray:
        """The (n, H, W) bool bitmaps."""
        return self._data

    @property
    def cls(self) -> torch.Tensor | np.ndarray:
        return self._cls

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self._data.shape)

    @property
    def orig_shape(self) -> tuple[int, int]:
        return self.shape[1], self.shape[2]

    def __len__(self) -> int:
        return int(self._data.shape[0])

    def _host(self) -> np.ndarray:
        d = self._data
        return d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else np.asarray(d)

    def _host_cls(self) -> np.ndarray:
        c = self._cls
        return (c.detach().cpu().numpy() if isinstance(c, torch.Tensor) else np.asarray(c)).astype(np.int64)

    @property
    def areas(self) -> np.ndarray:
        """(n,) pixels of each instance."""
        d = self._data
        if isinstance(d, torch.Tensor):
            return d.flatten(1).sum(1).cpu().numpy().astype(np.int64)
        return d.reshape(d.shape[0], -1).sum(1).astype(np.int64)

    @property
    def xy(self) -> list[list[np.ndarray]]:
        """Per instance its outer contours as (k, 2) float32 pixel polygons, largest first
        (OpenCV's border following; none for an empty mask)."""
        if self._xy is None:
            try:
                import cv2
            except ImportError as e:   # opencv is the 'ocr' extra's dependency
                raise ImportError("InstanceMasks.xy needs OpenCV: pip install 'libreyolo-graphs[ocr]' "
                                  "(opencv-python-headless)") from e
            out = []
            for m in self._host():
                contours, _ = cv2.findContours(m.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
                polys = sorted((c.reshape(-1, 2).astype(np.float32) for c in contours), key=len, reverse=True)
                out.append(polys)
            self._xy = out
        return [list(p) for p in self._xy]

    @property
    def xyn(self) -> list[list[np.ndarray]]:
        """:attr:`xy` divided by the image's (width, height)."""
        h, w = self.orig_shape
        scale = np.array([w, h], np.float32)
        return [[p / scale for p in polys] for polys in self.xy]

    def _like(self, data, cls) -> InstanceMasks:
        return InstanceMasks(data, cls)

    def cpu(self) -> InstanceMasks:
        conv = (lambda v: v.cpu() if isinstance(v, torch.Tensor) else v)
        return self._like(conv(self._data), conv(self._cls))

    def numpy(self) -> InstanceMasks:
        return self._like(self._host(), self._host_cls())

    def to(self, *args: Any, **kwargs: Any) -> InstanceMasks:
        """Move the bitmaps like ``torch.Tensor.to`` (they stay bool)."""
        d = self._data
        if isinstance(d, np.ndarray):
            d = torch.from_numpy(np.ascontiguousarray(d))
        moved = d.to(*args, **kwargs)
        return self._like(moved if moved.dtype == torch.bool else moved != 0, self._cls)

    def __getitem__(self, index: Any) -> InstanceMasks:
        d, c = self._data[index], self._cls[index]
        if d.ndim == 2:
            d, c = d[None], c.reshape(1)
        return self._like(d, c)

    def __repr__(self) -> str:
        where = f"tensor on {self._data.device}" if isinstance(self._data, torch.Tensor) else "numpy"
        return f"InstanceMasks(n={len(self)}, shape={self.orig_shape}, {where})"

    # ---- user-facing outputs -------------------------------------------------------------------
    def instance_rows(self, decimals: int = 5) -> list[dict[str, Any]]:
        """Per instance what ``Results.summary`` adds to its box row: the mask's area (pixels)
        and its polygons (``[[x, y], ...]`` lists in pixels)."""
        rows = []
        for area, polys in zip(self.areas.tolist(), self.xy):
            rows.append({"area": int(area),
                         "polygons": [np.round(p.astype(np.float64), decimals).tolist() for p in polys]})
        return rows

    def summary(self, names: dict[int, str], decimals: int = 5) -> list[dict[str, Any]]:
        """One dict per instance (without boxes): name, class, area and polygons."""
        cls = self._host_cls().tolist()
        return [{"name": names.get(c, str(c)), "class": c, **row} for c, row in zip(cls, self.instance_rows(decimals))]

    def plot_on(self, image: np.ndarray, names: dict[int, str], alpha: float = 0.5) -> np.ndarray:
        """``image`` (HxWx3 uint8 RGB, the masks' size) with each instance blended in its class
        colour (weight ``alpha``; later instances, the less confident, under earlier ones)."""
        masks = self._host()
        if tuple(image.shape[:2]) != masks.shape[1:]:
            raise ValueError(f"image of shape {tuple(image.shape)} does not match the masks {masks.shape[1:]}")
        out = image.astype(np.float32)
        for m, c in zip(masks[::-1], self._host_cls()[::-1]):
            color = np.array(class_color(int(c)), np.float32)
            out[m] = out[m] * (1.0 - alpha) + color * alpha
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
