"""What the built-in synthetic datasets share: their cache folder, the sizes they accept, the
atomic build-once into that folder, and the manifest that says a set is complete.

Most of them (``shapes``, ``shapes-seg``, ``shapes-depth``) pair each generated image with one
label file under ``images/<split>/`` and ``<labels>/<split>/``: :class:`PairedSet` writes such a
set, and each set declares only how one image and its label are drawn and how the label is saved.
``shapes-cls`` (one folder per class, no label files) uses the cache, build-once and manifest only.

Every set is deterministic (each image has its own seeded generator), idempotent (a complete set
with a matching manifest is reused) and atomic (written into a temporary folder that is renamed
into place, so an interrupted run or two processes racing never leave half a set behind).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image
from tqdm import tqdm

__all__ = ["JPEG_QUALITY", "PairedSet", "build_once", "cache_root", "check_sizes", "default_datasets_dir",
           "file_sha256", "image_size", "sized_params", "write_manifest"]

LOGGER = logging.getLogger("libreyolo")

#: JPEG quality of every built-in set's images.
JPEG_QUALITY = 92


def default_datasets_dir() -> Path:
    """Where built-in datasets live: ``$LIBREYOLO_DATASETS_DIR`` or ``~/.cache/libreyolo/datasets``."""
    env = os.environ.get("LIBREYOLO_DATASETS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "libreyolo" / "datasets"


def check_sizes(kind: str, n_train: int, n_val: int, imgsz: int) -> None:
    """Refuse split sizes below one image and an ``imgsz`` below 32 pixels, naming the set."""
    if n_train < 1 or n_val < 1:
        raise ValueError(f"n_train and n_val must be >= 1, got {n_train} and {n_val}")
    if imgsz < 32:
        raise ValueError(f"imgsz must be >= 32 for the {kind} dataset, got {imgsz}")


def sized_params(version: str, n_train: int, n_val: int, imgsz: int, seed: int) -> dict:
    """The manifest parameters of a set sized by split counts and image size."""
    return {"version": version, "n_train": int(n_train), "n_val": int(n_val), "imgsz": int(imgsz),
            "seed": int(seed)}


def cache_root(root: Path | str | None, name: str) -> Path:
    """The absolute folder of a set: ``root`` when given, else ``<datasets dir>/<name>``."""
    if root is None:
        root = default_datasets_dir() / name
    return Path(root).expanduser().absolute()


def build_once(root: Path, params: dict, kind: str, generate: Callable[[Path, dict], None], what: str) -> Path:
    """``root/data.yaml`` of a built-in dataset, generated into ``root`` unless it already holds a
    complete one with these ``params`` (its manifest says so). ``generate(tmp, params)`` writes
    every file and, last, the manifest into a temporary sibling folder, which is renamed onto
    ``root`` at once: readers never see half a dataset, and when two processes race the second
    uses the first one's copy. A ``root`` holding something else is refused, naming it."""
    if _is_complete(root, params):
        LOGGER.debug("%s dataset found complete at %s", kind, root)
        return root / "data.yaml"
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(
            f"cannot create the {kind} dataset at '{root}': it exists and is not a complete {kind} "
            "dataset with these parameters; remove it or choose another root"
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        LOGGER.info("generating the %s dataset (%s) in %s", kind, what, root)
        generate(tmp, params)
        try:
            os.rename(tmp, root)  # atomic; also replaces an empty directory left at root
        except OSError:
            if _is_complete(root, params):  # another process finished first: use its copy
                return root / "data.yaml"
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root / "data.yaml"


def _is_complete(root: Path, params: dict) -> bool:
    """True when ``root`` holds a finished dataset generated with ``params``."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("params") != params:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or "data.yaml" not in files:
        return False
    return all((root / rel).is_file() for rel in files)


def write_manifest(out: Path, params: dict, files: dict[str, str], data_yaml: str) -> None:
    """Write ``data.yaml`` and, last (its presence marks the set complete), ``manifest.json``: the
    parameters and the SHA-256 of every file, ``files`` (relative path -> hash) plus data.yaml."""
    (out / "data.yaml").write_text(data_yaml)
    files["data.yaml"] = file_sha256(out / "data.yaml")
    manifest = {"params": params, "files": dict(sorted(files.items()))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def image_size(rng: np.random.Generator, imgsz: int) -> tuple[int, int]:
    """(width, height): half the images are square; the others have a short side of 60%..100% of
    ``imgsz`` (the long side)."""
    if rng.random() < 0.5:
        return imgsz, imgsz
    short = int(round(imgsz * rng.uniform(0.6, 1.0)))
    return (imgsz, short) if rng.random() < 0.5 else (short, imgsz)


@dataclass(frozen=True)
class PairedSet:
    """A built-in set of JPEG images, each with one label file of the same stem.

    ``kind`` names the set (messages, progress bar); ``version`` starts its manifest and default
    folder name; ``streams`` are the random streams of the train and val images (distinct per set,
    so two sets never hold the same images); ``draw(rng, w, h)`` gives an image (HxWx3 uint8 RGB)
    and its label, which ``save_label(path, label)`` writes to ``<label_dir>/<split>/<stem>
    <label_suffix>``; ``data_yaml`` is the text of the set's ``data.yaml``.
    """

    kind: str
    version: str
    streams: tuple[int, int]
    label_dir: str
    label_suffix: str
    draw: Callable[[np.random.Generator, int, int], tuple[np.ndarray, Any]]
    save_label: Callable[[Path, Any], Any]
    data_yaml: str

    def make(self, root: Path | str | None, n_train: int, n_val: int, imgsz: int, seed: int) -> Path:
        """Write (or reuse) the set and return the path of its ``data.yaml``; ``root`` defaults to
        ``<datasets dir>/<version>-<n_train>-<n_val>-<imgsz>-<seed>``."""
        check_sizes(self.kind, n_train, n_val, imgsz)
        params = sized_params(self.version, n_train, n_val, imgsz, seed)
        root = cache_root(root, f"{self.version}-{n_train}-{n_val}-{imgsz}-{seed}")
        return build_once(root, params, self.kind, self.generate, f"{n_train} train + {n_val} val images")

    def generate(self, out: Path, params: dict) -> None:
        """Every image, label, data.yaml and (last) the manifest into ``out``."""
        imgsz, seed = params["imgsz"], params["seed"]
        files: dict[str, str] = {}
        jobs = [("train", i) for i in range(params["n_train"])] + [("val", i) for i in range(params["n_val"])]
        for split in ("train", "val"):
            (out / "images" / split).mkdir(parents=True)
            (out / self.label_dir / split).mkdir(parents=True)
        for split, i in tqdm(jobs, desc=f"{self.kind} dataset", unit="img", leave=False, disable=len(jobs) < 200):
            rng = np.random.default_rng([seed, self.streams[0] if split == "train" else self.streams[1], i])
            w, h = image_size(rng, imgsz)
            pixels, label = self.draw(rng, w, h)
            stem = f"{split}_{i:06d}"
            img_rel = f"images/{split}/{stem}.jpg"
            lab_rel = f"{self.label_dir}/{split}/{stem}{self.label_suffix}"
            Image.fromarray(pixels).save(out / img_rel, format="JPEG", quality=JPEG_QUALITY)
            self.save_label(out / lab_rel, label)
            files[img_rel] = file_sha256(out / img_rel)
            files[lab_rel] = file_sha256(out / lab_rel)
        write_manifest(out, params, files, self.data_yaml)
