"""The built-in ``shapes-pose`` dataset: quadrilaterals whose four corners are the keypoints.

Each image holds 1 to 4 filled quadrilaterals (a square or rectangle with jittered corners, tilted
by at most 25 degrees so each corner keeps its role) on a noisy background. The keypoints are the
corners in the order top-left, top-right, bottom-right, bottom-left (``kpt_shape: [4, 3]``, so a
horizontal flip swaps them as ``flip_idx: [1, 0, 3, 2]``); a corner covered by a later shape is
labelled with visibility 1 (occluded), the others with 2 (visible). Labels are YOLO-pose text rows
``cls cx cy w h x1 y1 v1 ... x4 y4 v4`` normalized to the image, the box being the shape's extent.

As in the detection ``shapes`` set (:mod:`libreyolo.data.synthetic`), every labelled shape can be
seen: a new quadrilateral may hide at most half of an earlier one, and its colour stands apart from
the background and from the shapes it overlaps (a placement that breaks either rule is drawn
again, else the shape is left out). Without these rules a shape could lie wholly hidden, or in its
background's colour, and still be labelled.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ...data.builtin import PairedSet
from ...data.synthetic import place_shape

__all__ = ["SHAPES_POSE_FLIP_IDX", "SHAPES_POSE_SKELETON", "make_shapes_pose_dataset", "render_pose_scene"]

_VERSION = "shapes-pose-v2"
#: a new shape may hide at most this share of an earlier one (the detection set's default)
MAX_HIDDEN = 0.5
#: placements tried per shape before it is left out
TRIES = 20
SHAPES_POSE_SKELETON = ((0, 1), (1, 2), (2, 3), (3, 0))
SHAPES_POSE_FLIP_IDX = (1, 0, 3, 2)


def _quad(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """(4, 2) corners tl, tr, br, bl of a jittered, tilted rectangle inside a (w, h) image."""
    short = min(w, h)
    half_w = short * float(rng.uniform(0.12, 0.28))
    half_h = half_w * float(rng.uniform(0.6, 1.5))
    base = np.array([[-half_w, -half_h], [half_w, -half_h], [half_w, half_h], [-half_w, half_h]])
    base += rng.uniform(-0.15, 0.15, (4, 2)) * np.array([half_w, half_h])
    a = math.radians(float(rng.uniform(-25, 25)))
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    pts = base @ rot.T
    lo, hi = pts.min(0), pts.max(0)
    cx = float(rng.uniform(-lo[0] + 1, w - hi[0] - 1))
    cy = float(rng.uniform(-lo[1] + 1, h - hi[1] - 1))
    return pts + np.array([cx, cy])


def render_pose_scene(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, str]:
    """One image (h, w, 3) uint8 RGB and its YOLO-pose label text."""
    bg = rng.uniform(30, 225, 3) + rng.normal(0, 12, (h, w, 3))
    img = np.clip(bg, 0, 255).astype(np.uint8)
    owner = np.full((h, w), -1, np.int64)      # the index of the quad that shows at each pixel
    quads: list[np.ndarray] = []
    areas: list[int] = []
    colors: list[tuple[int, int, int]] = []
    for _ in range(int(rng.integers(1, 5))):
        for _ in range(TRIES):
            q = _quad(rng, w, h)
            canvas = Image.new("L", (w, h), 0)
            ImageDraw.Draw(canvas).polygon([tuple(p) for p in q], fill=1)
            mask = np.asarray(canvas, bool)
            if mask.any() and place_shape(rng, img, owner, mask, areas, colors, MAX_HIDDEN):
                quads.append(q)
                break
    rows = []
    for k, q in enumerate(quads):
        (x1, y1), (x2, y2) = q.min(0), q.max(0)
        fields = [f"0 {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}"]
        cx, cy = q.mean(0)
        for x, y in q:
            # a corner is occluded when a later shape covers the pixels just inside it
            ix = int(min(w - 1, max(0, round(x + 0.1 * (cx - x)))))
            iy = int(min(h - 1, max(0, round(y + 0.1 * (cy - y)))))
            v = 2 if owner[iy, ix] == k else 1
            fields.append(f"{x / w:.6f} {y / h:.6f} {v}")
        rows.append(" ".join(fields) + "\n")
    return img, "".join(rows)


# streams 6 / 7: not those of the detection (0 / 1), segmentation (2 / 3) or depth (4 / 5) sets
_SET = PairedSet(
    kind="shapes-pose", version=_VERSION, streams=(6, 7), label_dir="labels", label_suffix=".txt",
    draw=render_pose_scene, save_label=Path.write_text,
    data_yaml="# libreyolo built-in synthetic pose dataset (libreyolo.tasks.pose.synthetic)\n"
              "path: .\ntrain: images/train\nval: images/val\nnc: 1\nnames:\n  0: quad\n"
              "kpt_shape: [4, 3]\nflip_idx: [1, 0, 3, 2]\nskeleton: [[0, 1], [1, 2], [2, 3], [3, 0]]\n"
              "kpt_sigmas: [0.1, 0.1, 0.1, 0.1]\n",
)


def make_shapes_pose_dataset(root: Path | str | None = None, n_train: int = 200, n_val: int = 50,
                             imgsz: int = 128, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic pose set and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-pose-v2-<n_train>-<n_val>-<imgsz>-<seed>``;
    ``imgsz`` is the long side of every image (the short side varies).
    """
    return _SET.make(root, n_train, n_val, imgsz, seed)
