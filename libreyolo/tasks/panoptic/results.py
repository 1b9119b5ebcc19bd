"""The panoptic result of one image: :class:`PanopticSegmentation` (``Results.panoptic``)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ...atomic import atomic_write
from ...results import PixelMap, class_color, load_font

__all__ = ["PanopticSegmentation", "id_to_rgb"]


def id_to_rgb(ids: np.ndarray) -> np.ndarray:
    """(H, W) segment ids -> (H, W, 3) uint8, COCO panoptic's PNG encoding (id = R + 256 G + 256^2 B)."""
    ids = ids.astype(np.int64)
    return np.stack((ids % 256, ids // 256 % 256, ids // 65536 % 256), -1).astype(np.uint8)


class PanopticSegmentation(PixelMap):
    """One image's panoptic segmentation: ``data`` is the (H, W) int32 map of segment ids at the
    original image's size (0 = void: no segment), ``segments`` one dict per segment in id order:
    ``id``, ``class``, ``isthing`` (a countable object, else a stuff region: one segment per class),
    ``score`` (the query's class probability) and ``area`` (pixels).

    ``class_map()``: the (H, W) class of each pixel (-1 void); :meth:`plot_on` colours each segment
    (stuff in its class colour, things shaded per instance), outlines them and names them at their
    centre; :meth:`summary` is ``segments`` with the names; :meth:`save_png` writes the map as a COCO
    panoptic PNG.
    """

    WHAT = "segment-id map"

    def __init__(self, data: torch.Tensor | np.ndarray, segments: list[dict[str, Any]] | None = None):
        super().__init__(data)
        self.segments = [dict(s) for s in (segments or [])]

    def _check_dtype(self, data: torch.Tensor | np.ndarray) -> None:
        is_int = (not data.dtype.is_floating_point and data.dtype != torch.bool) if isinstance(data, torch.Tensor) \
            else data.dtype.kind in "iu"
        if not is_int:
            raise ValueError(f"PanopticSegmentation data must hold integer segment ids, got dtype {data.dtype}")

    # conversions keep the segments
    def cpu(self) -> PanopticSegmentation:
        d = self._data
        return PanopticSegmentation(d.cpu() if isinstance(d, torch.Tensor) else d, self.segments)

    def numpy(self) -> PanopticSegmentation:
        d = self._data
        return PanopticSegmentation(d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else d, self.segments)

    def to(self, *args: Any, **kwargs: Any) -> PanopticSegmentation:
        d = self._data
        if isinstance(d, np.ndarray):
            d = torch.from_numpy(np.ascontiguousarray(d))
        return PanopticSegmentation(d.to(*args, **kwargs), self.segments)

    def __len__(self) -> int:
        return len(self.segments)

    def __repr__(self) -> str:
        things = sum(1 for s in self.segments if s["isthing"])
        return (f"PanopticSegmentation(shape={self.shape}, segments={len(self.segments)} ({things} things, "
                f"{len(self.segments) - things} stuff))")

    def _host(self) -> np.ndarray:
        d = self._data
        return d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else np.asarray(d)

    def class_map(self) -> np.ndarray:
        """(H, W) int64: each pixel's class, -1 where void."""
        lut = np.full(max([s["id"] for s in self.segments] + [0]) + 1, -1, dtype=np.int64)
        for s in self.segments:
            lut[s["id"]] = s["class"]
        return lut[self._host().astype(np.int64)]

    def summary(self, names: dict[int, str], decimals: int = 5) -> list[dict[str, Any]]:
        """One dict per segment, in id order: id, name, class, isthing, score, area (pixels)."""
        return [{"id": int(s["id"]), "name": names.get(int(s["class"]), str(s["class"])), "class": int(s["class"]),
                 "isthing": bool(s["isthing"]), "score": round(float(s["score"]), decimals), "area": int(s["area"])}
                for s in self.segments]

    def save_png(self, path) -> str:
        """Write the segment ids as a COCO panoptic PNG (RGB: id = R + 256 G + 256^2 B); returns the path."""
        with atomic_write(path, what="save") as f:
            Image.fromarray(id_to_rgb(self._host())).save(f, format="PNG")
        return str(path)

    def colors(self) -> dict[int, tuple[int, int, int]]:
        """Segment id -> its drawing colour: stuff its class colour, things their class colour
        shaded by the instance's rank within the class (so neighbours of one class differ)."""
        out: dict[int, tuple[int, int, int]] = {}
        seen: dict[int, int] = {}
        for s in self.segments:
            base = np.array(class_color(int(s["class"])), dtype=np.float64)
            if s["isthing"]:
                k = seen.get(s["class"], 0)
                seen[s["class"]] = k + 1
                shade = (0.0, 0.35, -0.3, 0.6, -0.5)[k % 5]
                base = base + (255 - base) * shade if shade >= 0 else base * (1 + shade)
            out[int(s["id"])] = tuple(int(v) for v in np.clip(np.rint(base), 0, 255))
        return out

    def plot_on(self, image: np.ndarray, names: dict[int, str], alpha: float = 0.55,
                labels: bool = True) -> np.ndarray:
        """``image`` (HxWx3 uint8 RGB, the map's size) with each segment filled in its colour
        (weight ``alpha``; void left as it is), white outlines between segments and each
        segment's class name at its centre of mass."""
        ids = self._host().astype(np.int64)
        if tuple(image.shape[:2]) != ids.shape:
            raise ValueError(f"image of shape {tuple(image.shape)} does not match the segment map {ids.shape}")
        colors = self.colors()
        lut = np.zeros((max(list(colors) + [0]) + 1, 3), dtype=np.float32)
        for k, c in colors.items():
            lut[k] = c
        painted = ids > 0
        out = image.astype(np.float32)
        out[painted] = out[painted] * (1 - alpha) + lut[ids[painted]] * alpha
        edge = np.zeros_like(painted)
        edge[:, 1:] |= ids[:, 1:] != ids[:, :-1]
        edge[1:, :] |= ids[1:, :] != ids[:-1, :]
        out[edge] = 255.0
        out = np.clip(np.rint(out), 0, 255).astype(np.uint8)
        if not labels or not self.segments:
            return out
        h, w = ids.shape
        fs = max(10, round((h + w) / 2 * 0.025))
        font = load_font(fs)
        pil = Image.fromarray(out)
        draw = ImageDraw.Draw(pil)
        for s in self.segments:
            ys, xs = np.nonzero(ids == s["id"])
            if xs.size == 0:
                continue
            text = names.get(int(s["class"]), str(s["class"]))
            tw = draw.textlength(text, font=font)
            x = min(max(0.0, float(xs.mean()) - tw / 2), max(0.0, w - tw))
            y = min(max(0.0, float(ys.mean()) - fs / 2), max(0.0, h - fs))
            draw.text((x, y), text, fill=(255, 255, 255), font=font, stroke_width=max(1, fs // 8),
                      stroke_fill=(0, 0, 0))
        return np.array(pil, dtype=np.uint8)
