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

import json
import logging
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from ...data.synthetic import (
    _JPEG_QUALITY,
    SHAPE_NAMES,
    _image_size,
    _sha256,
    build_once,
    default_datasets_dir,
    render_shapes_labelled,
)

__all__ = ["SHAPES_SEG_NAMES", "make_shapes_seg_dataset"]

log = logging.getLogger("libreyolo")

#: Class names, in class-id order: the background, then the shapes.
SHAPES_SEG_NAMES: tuple[str, ...] = ("background", *SHAPE_NAMES)
_VERSION = "shapes-seg-v1"


def make_shapes_seg_dataset(root: Path | str | None = None, n_train: int = 200, n_val: int = 50,
                            imgsz: int = 128, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic segmentation set and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-seg-v1-<n_train>-<n_val>-<imgsz>-<seed>``;
    ``imgsz`` is the long side of every image (the short side varies).
    """
    if n_train < 1 or n_val < 1:
        raise ValueError(f"n_train and n_val must be >= 1, got {n_train} and {n_val}")
    if imgsz < 32:
        raise ValueError(f"imgsz must be >= 32 for the shapes-seg dataset, got {imgsz}")
    params = {"version": _VERSION, "n_train": int(n_train), "n_val": int(n_val), "imgsz": int(imgsz),
              "seed": int(seed)}
    if root is None:
        root = default_datasets_dir() / f"{_VERSION}-{n_train}-{n_val}-{imgsz}-{seed}"
    root = Path(root).expanduser().absolute()
    return build_once(root, params, "shapes-seg", _generate, f"{n_train} train + {n_val} val images")


def _generate(out: Path, params: dict) -> None:
    """Every image, mask, data.yaml and (last) the manifest into ``out``."""
    imgsz, seed = params["imgsz"], params["seed"]
    files: dict[str, str] = {}
    jobs = [("train", i) for i in range(params["n_train"])] + [("val", i) for i in range(params["n_val"])]
    for split in ("train", "val"):
        (out / "images" / split).mkdir(parents=True)
        (out / "masks" / split).mkdir(parents=True)
    for split, i in tqdm(jobs, desc="shapes-seg dataset", unit="img", leave=False, disable=len(jobs) < 200):
        # streams 2 / 3: not the detection set's (0 / 1), so the two sets hold different images
        rng = np.random.default_rng([seed, 2 if split == "train" else 3, i])
        w, h = _image_size(rng, imgsz)
        pixels, _, labels = render_shapes_labelled(rng, w, h)
        stem = f"{split}_{i:06d}"
        img_rel, mask_rel = f"images/{split}/{stem}.jpg", f"masks/{split}/{stem}.png"
        Image.fromarray(pixels).save(out / img_rel, format="JPEG", quality=_JPEG_QUALITY)
        Image.fromarray((labels + 1).astype(np.uint8)).save(out / mask_rel, format="PNG")
        files[img_rel] = _sha256(out / img_rel)
        files[mask_rel] = _sha256(out / mask_rel)
    names = "\n".join(f"  {k}: {n}" for k, n in enumerate(SHAPES_SEG_NAMES))
    (out / "data.yaml").write_text(
        "# libreyolo built-in synthetic segmentation dataset (libreyolo.tasks.semantic.synthetic)\n"
        f"path: .\ntrain: images/train\nval: images/val\nignore_index: 255\nnames:\n{names}\n")
    files["data.yaml"] = _sha256(out / "data.yaml")
    manifest = {"params": params, "files": dict(sorted(files.items()))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
