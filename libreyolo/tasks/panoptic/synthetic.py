"""The built-in ``shapes-panoptic`` dataset: stuff regions with countable shapes on them.

Each image is a landscape of stuff - ``sky`` above a wavy horizon, ``ground`` below it and, in
half the images, a ``water`` band along the bottom - each a textured colour of its own, with 1 to
4 filled shapes (``triangle, square, pentagon, star, circle``: the things, never overlapping,
redrawn elsewhere up to 25 times until they fit) on top. The label is a panoptic PNG in this
library's class / instance encoding (:mod:`.data`): red = class + 1 (0 void), green + 256 blue =
the instance of a thing (1, 2, ...; 0 for stuff). Classes 0-4 are the things, 5-7 the stuff.

Generation is deterministic (one seeded generator per image), idempotent and atomic, in the
cache folder the other built-in sets use (:class:`libreyolo.data.builtin.PairedSet`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ...data.builtin import PairedSet
from ..segment.data import SHAPES_INST_NAMES, rasterize

__all__ = ["SHAPES_PANOPTIC_NAMES", "SHAPES_PANOPTIC_THINGS", "draw_panoptic", "make_shapes_panoptic_dataset"]

STUFF_NAMES = ("sky", "ground", "water")
SHAPES_PANOPTIC_NAMES: tuple[str, ...] = (*SHAPES_INST_NAMES, *STUFF_NAMES)
SHAPES_PANOPTIC_THINGS: tuple[int, ...] = tuple(range(len(SHAPES_INST_NAMES)))
_VERSION = "shapes-panoptic-v1"
_STUFF_BASE = {0: (110, 170, 235), 1: (120, 95, 60), 2: (30, 70, 150)}   # sky, ground, water


def _regular(n: int, r: float, cx: float, cy: float, angle: float, star: bool = False) -> np.ndarray:
    """The (k, 2) vertices of a regular n-gon (a star: 2n vertices, every other one at 0.45 r)."""
    k = 2 * n if star else n
    t = angle + np.arange(k) * 2 * np.pi / k
    rad = np.where(np.arange(k) % 2 == 1, r * 0.45, r) if star else np.full(k, r)
    return np.stack((cx + rad * np.cos(t), cy + rad * np.sin(t)), 1)


def _texture(rng: np.random.Generator, h: int, w: int, base: tuple[int, int, int]) -> np.ndarray:
    """A colour near ``base`` with a vertical ramp and pixel noise."""
    colour = np.clip(np.array(base) + rng.integers(-30, 31, 3), 0, 255)
    ramp = np.linspace(-1, 1, h)[:, None, None] * rng.integers(-25, 26, 3)
    noise = rng.normal(0, 6, (h, w, 3))
    return np.clip(colour + ramp + noise, 0, 255)


def draw_panoptic(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """(image HxWx3 uint8 RGB, label HxWx3 uint8 in the class / instance encoding)."""
    stuff = np.zeros((h, w), np.int64)                                   # 0 sky, 1 ground, 2 water
    xs = np.arange(w)
    horizon = h * rng.uniform(0.3, 0.6) + h * 0.06 * np.sin(xs / w * 2 * np.pi * rng.uniform(0.5, 2) + rng.uniform(0, 6))
    stuff[np.arange(h)[:, None] >= horizon[None, :]] = 1
    if rng.random() < 0.5:
        shore = h * rng.uniform(0.75, 0.9) + h * 0.03 * np.sin(xs / w * 2 * np.pi * rng.uniform(1, 3))
        stuff[np.arange(h)[:, None] >= shore[None, :]] = 2
    img = np.zeros((h, w, 3))
    for k, base in _STUFF_BASE.items():
        img[stuff == k] = _texture(rng, h, w, base)[stuff == k]
    cls = (len(SHAPES_INST_NAMES) + stuff).astype(np.int64)
    inst = np.zeros((h, w), np.int64)
    pil = Image.fromarray(img.astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    taken = np.zeros((h, w), bool)
    short = min(w, h)
    n = 0
    for _ in range(int(rng.integers(1, 5))):
        for _attempt in range(25):
            c = int(rng.integers(len(SHAPES_INST_NAMES)))
            r = rng.uniform(0.08, 0.22) * short
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
            a = rng.uniform(0, 2 * np.pi)
            poly = {0: lambda: _regular(3, r, cx, cy, a), 1: lambda: _regular(4, r, cx, cy, a),
                    2: lambda: _regular(5, r, cx, cy, a), 3: lambda: _regular(5, r, cx, cy, a, star=True),
                    4: lambda: _regular(32, r, cx, cy, 0.0)}[c]() - 0.5
            m = rasterize([poly], h, w)[0]
            if m.sum() < 16 or (m & taken).any():
                continue
            under = np.asarray(pil)[m].mean(0)
            colour = tuple(int(v) for v in np.clip(255 - under + rng.integers(-40, 41, 3), 0, 255))
            draw.polygon([tuple(v) for v in poly.tolist()], fill=colour)
            taken |= m
            n += 1
            cls[m], inst[m] = c, n
            break
    label = np.stack((cls + 1, inst % 256, inst // 256), -1).astype(np.uint8)
    return np.asarray(pil), label


def _save_label(path: Path, label: np.ndarray) -> None:
    Image.fromarray(label).save(path, format="PNG")


_NAMES_YAML = "\n".join(f"  {k}: {n}" for k, n in enumerate(SHAPES_PANOPTIC_NAMES))
_SET = PairedSet(
    kind="shapes-panoptic", version=_VERSION, streams=(20, 21), label_dir="panoptic", label_suffix=".png",
    draw=draw_panoptic, save_label=_save_label,
    data_yaml="# libreyolo built-in synthetic panoptic dataset (libreyolo.tasks.panoptic.synthetic)\n"
              f"path: .\ntrain: images/train\nval: images/val\n"
              f"things: [{', '.join(str(k) for k in SHAPES_PANOPTIC_THINGS)}]\nnames:\n{_NAMES_YAML}\n",
)


def make_shapes_panoptic_dataset(root: Path | str | None = None, n_train: int = 96, n_val: int = 32,
                                 imgsz: int = 128, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic panoptic set and return the path of its ``data.yaml``;
    ``imgsz`` is the long side of every image (the short side varies)."""
    return _SET.make(root, n_train, n_val, imgsz, seed)
