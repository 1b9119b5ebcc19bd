"""The built-in ``shapes-seg`` dataset: the ``shapes`` images with per-pixel labels.

Each image is drawn by :func:`libreyolo.data.synthetic.render_shapes_labelled` (the detection
set's shapes on its varied backgrounds; images not all square, so the stretch resize is
exercised); its mask (8-bit grey PNG) holds 0 for the background and 1 + the shape class for each
pixel a shape shows (``background, circle, square, triangle, star, cross``). Generation is
deterministic (each image has its own seeded generator), idempotent (a complete set with a
matching manifest is reused) and atomic (written into a temporary folder renamed into place),
in the cache folder the ``shapes`` set uses (``$LIBREYOLO_DATASETS_DIR`` or
``~/.cache/libreyolo/datasets``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ...data.builtin import PairedSet
from ...data.synthetic import SHAPE_NAMES, render_shapes_labelled

__all__ = ["SHAPES_SEG_NAMES", "make_shapes_seg_dataset"]

#: Class names, in class-id order: the background, then the shapes.
SHAPES_SEG_NAMES: tuple[str, ...] = ("background", *SHAPE_NAMES)
_VERSION = "shapes-seg-v1"


def _draw_mask(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    pixels, _, labels = render_shapes_labelled(rng, w, h)
    return pixels, labels


def _save_mask(path: Path, labels: np.ndarray) -> None:
    """The mask as an 8-bit grey PNG: 0 the background, 1 + class where a shape shows."""
    Image.fromarray((labels + 1).astype(np.uint8)).save(path, format="PNG")


_NAMES_YAML = "\n".join(f"  {k}: {n}" for k, n in enumerate(SHAPES_SEG_NAMES))

# streams 2 / 3: not the detection set's (0 / 1), so the two sets hold different images
_SET = PairedSet(
    kind="shapes-seg", version=_VERSION, streams=(2, 3), label_dir="masks", label_suffix=".png",
    draw=_draw_mask, save_label=_save_mask,
    data_yaml="# libreyolo built-in synthetic segmentation dataset (libreyolo.tasks.semantic.synthetic)\n"
              f"path: .\ntrain: images/train\nval: images/val\nignore_index: 255\nnames:\n{_NAMES_YAML}\n",
)


def make_shapes_seg_dataset(root: Path | str | None = None, n_train: int = 200, n_val: int = 50,
                            imgsz: int = 128, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic segmentation set and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-seg-v1-<n_train>-<n_val>-<imgsz>-<seed>``;
    ``imgsz`` is the long side of every image (the short side varies).
    """
    return _SET.make(root, n_train, n_val, imgsz, seed)
