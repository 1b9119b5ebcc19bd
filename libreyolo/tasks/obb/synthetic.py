"""The built-in ``shapes-obb`` dataset: rotated rectangles and ellipses at random angles.

Each image holds 1 to 4 filled shapes - class 0 a rectangle, class 1 an ellipse - of random size,
aspect (1.3:1 to 3:1, so every angle is visible) and angle, wholly inside the image, on a noisy
background. A shape's oriented box is the rectangle itself, or the ellipse's enclosing rectangle
along its axes. Labels are YOLO-OBB text rows ``cls x1 y1 x2 y2 x3 y3 x4 y4`` (the four corners,
normalized to the image). Images are drawn from a seeded generator, so a set is the same on
every machine.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ...data.builtin import PairedSet

__all__ = ["make_shapes_obb_dataset", "render_obb_scene"]

_VERSION = "shapes-obb-v1"


def _shape(rng: np.random.Generator, w: int, h: int) -> tuple[float, float, float, float, float]:
    """(cx, cy, long side, short side, angle) of a shape wholly inside a (w, h) image."""
    short = min(w, h)
    long_side = short * float(rng.uniform(0.22, 0.5))
    short_side = long_side / float(rng.uniform(1.3, 3.0))
    a = float(rng.uniform(0.0, math.pi))
    ex = abs(math.cos(a)) * long_side / 2 + abs(math.sin(a)) * short_side / 2
    ey = abs(math.sin(a)) * long_side / 2 + abs(math.cos(a)) * short_side / 2
    cx = float(rng.uniform(ex + 1, w - ex - 1))
    cy = float(rng.uniform(ey + 1, h - ey - 1))
    return cx, cy, long_side, short_side, a


def _corners(cx: float, cy: float, lw: float, sh: float, a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    wv, hv = np.array([c * lw / 2, s * lw / 2]), np.array([-s * sh / 2, c * sh / 2])
    ctr = np.array([cx, cy])
    return np.stack((ctr - wv - hv, ctr + wv - hv, ctr + wv + hv, ctr - wv + hv))


def render_obb_scene(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, str]:
    """One image (h, w, 3) uint8 RGB and its YOLO-OBB label text."""
    bg = rng.uniform(30, 225, 3) + rng.normal(0, 12, (h, w, 3))
    image = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    rows = []
    for _ in range(int(rng.integers(1, 5))):
        cls = int(rng.integers(0, 2))
        cx, cy, lw, sh, a = _shape(rng, w, h)
        color = tuple(int(c) for c in rng.uniform(0, 255, 3))
        box = _corners(cx, cy, lw, sh, a)
        if cls == 0:
            draw.polygon([tuple(p) for p in box], fill=color)
        else:   # the ellipse as a 64-gon along its axes
            t = np.linspace(0, 2 * math.pi, 64, endpoint=False)
            px = cx + np.cos(t) * lw / 2 * math.cos(a) - np.sin(t) * sh / 2 * math.sin(a)
            py = cy + np.cos(t) * lw / 2 * math.sin(a) + np.sin(t) * sh / 2 * math.cos(a)
            draw.polygon(list(zip(px.tolist(), py.tolist())), fill=color)
        rows.append(f"{cls} " + " ".join(f"{x / w:.6f} {y / h:.6f}" for x, y in box) + "\n")
    return np.asarray(image, dtype=np.uint8), "".join(rows)


# streams 10 / 11: not those of the detection (0 / 1), segmentation (2 / 3), depth (4 / 5), pose (6 / 7)
# or instance-segmentation sets
_SET = PairedSet(
    kind="shapes-obb", version=_VERSION, streams=(10, 11), label_dir="labels", label_suffix=".txt",
    draw=render_obb_scene, save_label=Path.write_text,
    data_yaml="# libreyolo built-in synthetic oriented-box dataset (libreyolo.tasks.obb.synthetic)\n"
              "path: .\ntrain: images/train\nval: images/val\nnc: 2\nnames:\n  0: rectangle\n  1: ellipse\n",
)


def make_shapes_obb_dataset(root: Path | str | None = None, n_train: int = 200, n_val: int = 50,
                            imgsz: int = 128, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic oriented-box set and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-obb-v1-<n_train>-<n_val>-<imgsz>-<seed>``;
    ``imgsz`` is the long side of every image (the short side varies).
    """
    return _SET.make(root, n_train, n_val, imgsz, seed)
