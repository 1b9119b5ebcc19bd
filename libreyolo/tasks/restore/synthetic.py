"""The built-in ``shapes-restore`` dataset: clean shape scenes and their degraded versions.

Each clean image (``gt/``, PNG) is a scene of the built-in ``shapes`` set (flat, gradient, noise,
striped or cluttered background, a few filled shapes; :func:`libreyolo.data.synthetic.render_shapes`),
square, ``imgsz`` pixels a side (a multiple of 4). Three degraded versions of it, PNG each:

* ``lq/`` - same size (NAFNet): Gaussian blur (sigma 0.5 - 1.5) then Gaussian noise (sigma 5 - 20
  levels), rounded to whole levels;
* ``lq_x2/``, ``lq_x4/`` - half and quarter size (the super-resolution families): a light blur
  (sigma 0.3 - 1.0), bicubic downscaling, then light noise (sigma 1 - 5 levels).

Generation is deterministic (each image and degradation has its own seeded generator), idempotent
and atomic, in the cache folder of the other built-in sets (``$LIBREYOLO_DATASETS_DIR`` or
``~/.cache/libreyolo/datasets``).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from ...data.builtin import build_once, cache_root, check_sizes, file_sha256, sized_params, write_images, write_manifest
from ...data.synthetic import render_shapes

__all__ = ["SCALES", "degrade", "make_shapes_restore_dataset"]

_VERSION = "shapes-restore-v1"
#: the degraded versions the set holds: scale -> folder
SCALES = {1: "lq", 2: "lq_x2", 4: "lq_x4"}
_STREAMS = (10, 11)   # train / val: not the other built-in sets' streams
_YAML = "# libreyolo built-in synthetic restoration dataset (libreyolo.tasks.restore.synthetic)\n" \
        "path: .\ntrain: train\nval: val\n"


def degrade(clean: np.ndarray, scale: int, rng: np.random.Generator) -> np.ndarray:
    """(H, W, 3) uint8 clean image -> its degraded version (H / scale, W / scale, 3) uint8 (see the
    module docstring)."""
    im = Image.fromarray(clean)
    if scale == 1:
        sigma, noise = rng.uniform(0.5, 1.5), rng.uniform(5.0, 20.0)
    else:
        sigma, noise = rng.uniform(0.3, 1.0), rng.uniform(1.0, 5.0)
    im = im.filter(ImageFilter.GaussianBlur(radius=float(sigma)))
    if scale != 1:
        im = im.resize((clean.shape[1] // scale, clean.shape[0] // scale), Image.BICUBIC)
    x = np.asarray(im, dtype=np.float32)
    x = x + rng.normal(0.0, noise, x.shape).astype(np.float32)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _write_one(out: Path, imgsz: int, seed: int, job: tuple[str, int]) -> dict[str, str]:
    split, i = job
    stream = _STREAMS[0] if split == "train" else _STREAMS[1]
    clean, _ = render_shapes(np.random.default_rng([seed, stream, i]), imgsz, imgsz)
    files = {}
    stem = f"{split}_{i:06d}.png"
    rel = f"{split}/gt/{stem}"
    Image.fromarray(clean).save(out / rel)
    files[rel] = file_sha256(out / rel)
    for scale, folder in SCALES.items():
        lq = degrade(clean, scale, np.random.default_rng([seed, stream, i, scale]))
        rel = f"{split}/{folder}/{stem}"
        Image.fromarray(lq).save(out / rel)
        files[rel] = file_sha256(out / rel)
    return files


def _generate(out: Path, params: dict) -> None:
    jobs = [("train", i) for i in range(params["n_train"])] + [("val", i) for i in range(params["n_val"])]
    for split in ("train", "val"):
        for folder in ("gt", *SCALES.values()):
            (out / split / folder).mkdir(parents=True)
    files = write_images("shapes-restore", jobs,
                         functools.partial(_write_one, out, params["imgsz"], params["seed"]), params["imgsz"])
    write_manifest(out, params, files, _YAML)


def make_shapes_restore_dataset(root: Path | str | None = None, n_train: int = 64, n_val: int = 16,
                                imgsz: int = 256, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic restoration set and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-restore-v1-<n_train>-<n_val>-<imgsz>-<seed>``;
    ``imgsz`` is the clean images' side (a multiple of 4, so the x4 versions are exact).
    """
    check_sizes("shapes-restore", n_train, n_val, imgsz)
    if imgsz % 4:
        raise ValueError(f"shapes-restore: imgsz must be a multiple of 4 (the x4 versions), got {imgsz}")
    params = sized_params(_VERSION, n_train, n_val, imgsz, seed)
    root = cache_root(root, f"{_VERSION}-{n_train}-{n_val}-{imgsz}-{seed}")
    return build_once(root, params, "shapes-restore", _generate, f"{n_train} train + {n_val} val images")
