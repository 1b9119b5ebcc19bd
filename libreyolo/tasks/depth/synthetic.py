"""The built-in ``shapes-depth`` dataset: simple scenes with exact per-pixel depth.

Each scene is a far wall above a horizon and a ground plane below it (depth falling towards the
bottom as a camera above a floor sees it, a checkerboard whose squares shrink with distance), and
2-5 upright boxes and discs, each at one depth, drawn far to near (nearer ones hide farther ones)
with a size inversely proportional to their depth. Every surface fades towards a grey haze with
distance, so depth can be read from perspective, occlusion, texture and haze. The depth map
(float32 ``.npy``, the units arbitrary, 1.5 - 10) is exact, with no invalid pixel. Generation is
deterministic (each image has its own seeded generator), idempotent and atomic, in the cache folder
of the other built-in sets (``$LIBREYOLO_DATASETS_DIR`` or ``~/.cache/libreyolo/datasets``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...data.builtin import PairedSet

__all__ = ["make_shapes_depth_dataset", "render_depth_scene"]

_VERSION = "shapes-depth-v1"
FAR = 10.0          # depth of the wall
CAMERA = 1.5        # height of the camera over the ground, in the same units
NEAR = 1.5          # the nearest depth an object can have
_HAZE = np.array([180.0, 185.0, 195.0], np.float32)


def render_depth_scene(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """One scene: ((h, w, 3) uint8 RGB, (h, w) float32 depth)."""
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    horizon = h * float(rng.uniform(0.25, 0.55))
    focal = float(h)
    below = ys > horizon + 1e-3
    depth = np.full((h, w), FAR, np.float32)
    depth[below] = np.minimum(FAR, CAMERA * focal / (ys[below] - horizon))
    color = np.empty((h, w, 3), np.float32)
    color[:] = rng.uniform(40, 220, 3)                                     # the wall
    ground_a, ground_b = rng.uniform(30, 230, 3), rng.uniform(30, 230, 3)
    # ground coordinates (lateral x, forward z) of each pixel: the checkerboard lies on the floor
    gx = (xs - w / 2) * depth / focal
    checker = ((np.floor(gx / 0.6) + np.floor(depth / 0.6)) % 2).astype(bool)
    color[below] = np.where(checker[below, None], ground_a, ground_b)
    for d in sorted(rng.uniform(NEAR, FAR * 0.8, int(rng.integers(2, 6))), reverse=True):   # far to near
        size = focal * float(rng.uniform(0.6, 1.6)) / d
        cx = float(rng.uniform(0, w))
        foot = horizon + CAMERA * focal / d                                   # where it stands on the floor
        half_w, height = size * float(rng.uniform(0.3, 0.7)), size * float(rng.uniform(0.6, 1.4))
        if rng.random() < 0.5:
            inside = (np.abs(xs - cx) <= half_w) & (ys <= foot) & (ys >= foot - height)
        else:
            cy = foot - height / 2
            inside = ((xs - cx) / max(half_w, 1.0)) ** 2 + ((ys - cy) / max(height / 2, 1.0)) ** 2 <= 1.0
        inside &= depth > d                                                  # what it hides is farther
        depth[inside] = d
        base = rng.uniform(20, 235, 3).astype(np.float32)
        shade = 0.75 + 0.25 * np.clip((xs[inside] - (cx - half_w)) / max(2 * half_w, 1.0), 0, 1)
        color[inside] = base * shade[:, None]
    haze = (depth / FAR * 0.6)[..., None]
    pixels = color * (1 - haze) + _HAZE * haze
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8), depth.astype(np.float32)


# streams 4 / 5: not those of the detection (0 / 1) or segmentation (2 / 3) sets
_SET = PairedSet(
    kind="shapes-depth", version=_VERSION, streams=(4, 5), label_dir="depth", label_suffix=".npy",
    draw=render_depth_scene, save_label=np.save,
    data_yaml="# libreyolo built-in synthetic depth dataset (libreyolo.tasks.depth.synthetic)\n"
              "path: .\ntrain: images/train\nval: images/val\ntarget: depth\n",
)


def make_shapes_depth_dataset(root: Path | str | None = None, n_train: int = 200, n_val: int = 50,
                              imgsz: int = 128, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic depth set and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-depth-v1-<n_train>-<n_val>-<imgsz>-<seed>``;
    ``imgsz`` is the long side of every image (the short side varies).
    """
    return _SET.make(root, n_train, n_val, imgsz, seed)
