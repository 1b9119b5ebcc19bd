"""The built-in ``shapes-cls`` dataset: one synthetic shape per image, six classes, ImageFolder layout.

The classification counterpart of the detection ``shapes`` set (:mod:`libreyolo.data.synthetic`),
drawn with its code: its backgrounds (flat, gradient, smooth noise, stripes, clutter lines, grain
on half of them) and its shape masks. Each image (64 to 96 px a side, not square) holds one large
filled shape (45% to 85% of the short side) of class ``circle, square, triangle, star, cross`` or
``hexagon``, in a bright colour over the darkened background; classes take turns, so both splits
are balanced. Written as ``train/<class>/*.jpg``, ``val/<class>/*.jpg`` and a ``data.yaml``.

Generation is deterministic (each image has its own seeded generator: the same arguments give
byte-identical files), idempotent (a complete set with a matching manifest is reused) and atomic
(written into a temporary folder renamed into place), in the same cache as the detection set.
"""
from __future__ import annotations

import functools
import logging
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .builtin import JPEG_QUALITY, build_once, cache_root, file_sha256, write_images, write_manifest
from .synthetic import SHAPE_NAMES, random_background, shape_mask

__all__ = ["SHAPES_CLS_NAMES", "make_shapes_cls_dataset", "render_shape_image"]

LOGGER = logging.getLogger(__name__)

#: Class names, in class-id order: the detection set's five shapes and a hexagon.
SHAPES_CLS_NAMES: tuple[str, ...] = (*SHAPE_NAMES, "hexagon")

_VERSION = "shapes-cls-v1"
_MIN_SIDE, _MAX_SIDE = 64, 96
_MIN_REL, _MAX_REL = 0.45, 0.85
_MAX_TILT = 20.0
_BG_GAIN = 0.3


def make_shapes_cls_dataset(root: Path | str | None = None, n_train: int = 600, n_val: int = 120,
                            seed: int = 0) -> Path:
    """Write (or reuse) the synthetic classification set and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-cls-v1-<n_train>-<n_val>-<seed>`` (see
    :func:`~libreyolo.data.synthetic.default_datasets_dir`).
    """
    nc = len(SHAPES_CLS_NAMES)
    if n_train < nc or n_val < nc:
        raise ValueError(f"n_train and n_val must be >= {nc} (one image per class), got {n_train} and {n_val}")
    params = {"version": _VERSION, "n_train": int(n_train), "n_val": int(n_val), "seed": int(seed)}
    root = cache_root(root, f"{_VERSION}-{n_train}-{n_val}-{seed}")
    return build_once(root, params, "shapes-cls", _generate, f"{n_train} train + {n_val} val images")


def _generate(out: Path, params: dict) -> None:
    jobs = []
    for split, n in (("train", params["n_train"]), ("val", params["n_val"])):
        for name in SHAPES_CLS_NAMES:
            (out / split / name).mkdir(parents=True)
        jobs += [(split, i) for i in range(n)]
    files = write_images("shapes-cls", jobs, functools.partial(_write_one, out, params["seed"]), _MAX_SIDE)
    names = "\n".join(f"  - {n}" for n in SHAPES_CLS_NAMES)
    write_manifest(out, params, files,
                   "# libreyolo built-in synthetic classification dataset (libreyolo.data.shapes_cls)\n"
                   f"path: .\ntrain: train\nval: val\nnames:\n{names}\n")


def _write_one(out: Path, seed: int, job: tuple[str, int]) -> dict[str, str]:
    """Draw image ``job = (split, index)``, write it into ``out``; its SHA-256 by relative path."""
    split, i = job
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, i])
    cls = i % len(SHAPES_CLS_NAMES)
    pixels = render_shape_image(rng, cls)
    rel = f"{split}/{SHAPES_CLS_NAMES[cls]}/{split}_{i:05d}.jpg"
    Image.fromarray(pixels).save(out / rel, format="JPEG", quality=JPEG_QUALITY)
    return {rel: file_sha256(out / rel)}


def render_shape_image(rng: np.random.Generator, cls: int) -> np.ndarray:
    """One HxWx3 uint8 RGB image of a single shape of class ``cls`` on a random background.

    The background (any of the detection set's kinds) is darkened to at most 45% brightness and
    the shape filled with a bright colour (brightest channel >= 200): the shape always stands
    out lighter than its surround, so the class is in the outline, whatever the colours - a set a
    network trained from scratch learns within a few epochs (with both contrast polarities and
    free colours, a few hundred images are memorised, not generalised).
    """
    w, h = (int(v) for v in rng.integers(_MIN_SIDE, _MAX_SIDE + 1, 2))
    img = (random_background(rng, w, h).astype(np.float32) * _BG_GAIN).astype(np.uint8)
    extent = rng.uniform(_MIN_REL, _MAX_REL) * min(w, h)
    mask = _mask(rng, cls, extent, w, h)
    color = rng.integers(60, 256, 3)
    color[int(rng.integers(3))] = int(rng.integers(200, 256))
    img[mask] = color.astype(np.uint8)
    return img


def _mask(rng: np.random.Generator, cls: int, extent: float, w: int, h: int) -> np.ndarray:
    if cls < len(SHAPE_NAMES):
        return shape_mask(rng, cls, extent, w, h)
    if cls != len(SHAPE_NAMES):
        raise ValueError(f"unknown shapes-cls class {cls}")
    r = extent / 2.0  # hexagon of circumradius r, slightly rotated
    cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
    tilt = math.radians(rng.uniform(-_MAX_TILT, _MAX_TILT))
    pts = [(cx + r * math.cos(tilt + k * math.pi / 3), cy + r * math.sin(tilt + k * math.pi / 3)) for k in range(6)]
    im = Image.new("L", (w, h), 0)
    ImageDraw.Draw(im).polygon(pts, fill=255)
    return np.asarray(im) > 0
