"""The built-in ``shapes-point`` dataset: small discs and squares, labelled by their centres.

Each image holds 2 to 10 small filled shapes - discs (class 0) and squares (class 1), 6 to 14
pixels across at the set's default 128-pixel long side - on a noisy background of one random
colour, each shape's colour at least a set distance from the background's. Centres keep 16
pixels apart, so at FOMO's 1/8 output grid two objects rarely share a cell. Labels are point
rows ``class x y`` normalized to the image (the point-label format of :mod:`.data`). Generation
is deterministic (each image has its own seeded generator), idempotent and atomic, in the cache
folder of the other built-in sets (``$LIBREYOLO_DATASETS_DIR`` or ``~/.cache/libreyolo/datasets``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ...data.builtin import PairedSet

__all__ = ["SHAPES_POINT_NAMES", "make_shapes_point_dataset", "render_point_scene"]

_VERSION = "shapes-point-v1"
SHAPES_POINT_NAMES = ("disc", "square")
_MIN_GAP = 16.0        # least distance between two centres, pixels
_MIN_CONTRAST = 110.0  # least RGB distance between a shape and the background


def render_point_scene(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, str]:
    """One image (h, w, 3) uint8 RGB and its point-label text."""
    bg_color = rng.uniform(20, 235, 3)
    bg = bg_color + rng.normal(0, 10, (h, w, 3))
    image = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    centres: list[tuple[float, float]] = []
    rows = []
    for _ in range(int(rng.integers(2, 11))):
        half = float(rng.uniform(3.0, 7.0))
        for _try in range(20):   # a free place, else the shape is left out
            cx, cy = float(rng.uniform(half, w - half)), float(rng.uniform(half, h - half))
            if all((cx - x) ** 2 + (cy - y) ** 2 >= _MIN_GAP ** 2 for x, y in centres):
                break
        else:
            continue
        while True:
            color = rng.uniform(0, 255, 3)
            if np.linalg.norm(color - bg_color) >= _MIN_CONTRAST:
                break
        k = int(rng.integers(0, len(SHAPES_POINT_NAMES)))
        box = (cx - half, cy - half, cx + half, cy + half)
        fill = tuple(int(c) for c in color)
        if k == 0:
            draw.ellipse(box, fill=fill)
        else:
            draw.rectangle(box, fill=fill)
        centres.append((cx, cy))
        rows.append(f"{k} {cx / w:.6f} {cy / h:.6f}\n")
    return np.asarray(image, dtype=np.uint8), "".join(rows)


# streams 20 / 21: not those of the other built-in sets (detection 0 / 1, segmentation 2 / 3, depth
# 4 / 5, pose and instances 6 / 7, obb 10 / 11)
_SET = PairedSet(
    kind="shapes-point", version=_VERSION, streams=(20, 21), label_dir="labels", label_suffix=".txt",
    draw=render_point_scene, save_label=Path.write_text,
    data_yaml="# libreyolo built-in synthetic point dataset (libreyolo.tasks.point.synthetic)\n"
              "path: .\ntrain: images/train\nval: images/val\nnames:\n  0: disc\n  1: square\n",
)


def make_shapes_point_dataset(root: Path | str | None = None, n_train: int = 200, n_val: int = 50,
                              imgsz: int = 128, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic point set and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-point-v1-<n_train>-<n_val>-<imgsz>-<seed>``;
    ``imgsz`` is the long side of every image (the short side varies).
    """
    return _SET.make(root, n_train, n_val, imgsz, seed)
