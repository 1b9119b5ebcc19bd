"""Reading datasets whose every image has one label file of the same stem (semantic masks, depth
maps): the ``data=`` argument, the dataset YAML and the pairing of images with label files, shared
by the tasks that train on such sets. Each task keeps its own YAML keys, checks and sample type.

The YAML names ``path`` (the root; relative to the YAML's folder), ``train`` and ``val`` (image
folders under the root, searched recursively) and, optionally, ``<labels key>: {train: folder,
val: folder}``; without it, an image's label file is the image path with its last ``images``
folder replaced by the labels folder name (``images/train/a.jpg`` -> ``masks/train/a.png``).
Every structural mistake raises at once, naming the YAML and the key or folder.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .datasets import check_data_given, is_image_path, read_yaml

__all__ = ["label_dirs", "mirror_images", "pair_images", "read_spec", "resolve_data_arg", "spec_root",
           "split_images", "under"]

T = TypeVar("T")


def resolve_data_arg(data: Any, builtin: str, make_builtin: Callable[[], Path], resolve_yaml: Callable[[Path], T],
                     what: str) -> T:
    """``builtin`` (the name of the task's built-in set, which ``make_builtin()`` writes and
    returns the YAML of), a dataset YAML or a folder holding ``data.yaml`` -> ``resolve_yaml``'s
    result (its ``source`` is the built-in name for the built-in set). ``what`` names the kind of
    YAML in the error ("depth dataset"). ``data=None`` is refused (:func:`check_data_given`)."""
    check_data_given(data, (builtin,))
    if isinstance(data, str) and data == builtin:
        out = resolve_yaml(make_builtin())
        out.source = builtin
        return out
    path = Path(os.fspath(data)).expanduser()
    if path.is_dir() and (path / "data.yaml").is_file():
        path = path / "data.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"dataset not found: '{data}' (expected '{builtin}', a {what} YAML file, "
                                "or a folder holding data.yaml)")
    return resolve_yaml(path)


def read_spec(yaml_path: Path, expected: str) -> tuple[Path, dict]:
    """(absolute YAML path, its mapping): refused when it is not text, not valid YAML, not a
    mapping (the message says it should hold ``expected``, e.g. ``path/train/val``; see
    :func:`~libreyolo.data.datasets.read_yaml`) or lacks path/train/val."""
    yaml_path = yaml_path.absolute()
    spec = read_yaml(yaml_path, expected)
    for key in ("path", "train", "val"):
        if spec.get(key) in (None, "", []):
            raise FileNotFoundError(f"{yaml_path}: required entry '{key}' is missing")
    return yaml_path, spec


def spec_root(yaml_path: Path, spec: dict) -> Path:
    """The dataset root the YAML's ``path`` names (``~`` expanded, relative to the YAML's folder),
    which must be a folder."""
    root = Path(os.path.expanduser(str(spec["path"])))
    root = Path(os.path.normpath(root if root.is_absolute() else yaml_path.parent / root))
    if not root.is_dir():
        raise FileNotFoundError(f"{yaml_path}: 'path' folder not found: {root}")
    return root


def label_dirs(yaml_path: Path, spec: dict, key: str) -> dict:
    """The YAML's optional ``key: {train: folder, val: folder}`` (empty when absent)."""
    dirs = spec.get(key) or {}
    if not isinstance(dirs, dict) or not set(dirs) <= {"train", "val"}:
        raise ValueError(f"{yaml_path}: '{key}' must be a mapping with 'train' and/or 'val' folders, got {dirs!r}")
    return dirs


def split_images(yaml_path: Path, root: Path, entry: Any, split: str) -> tuple[Path, list[Path]]:
    """(the image folder ``entry`` names under ``root``, its images, sorted, searched recursively);
    a missing folder or one with no image is refused, naming the split."""
    img_dir = under(root, entry)
    if not img_dir.is_dir():
        raise FileNotFoundError(f"{yaml_path}: '{split}' image folder not found: {img_dir}")
    images = sorted(p for p in img_dir.rglob("*") if is_image_path(p))
    if not images:
        raise FileNotFoundError(f"{yaml_path}: '{split}' has no images in {img_dir}")
    return img_dir, images


def pair_images(yaml_path: Path, img_dir: Path, images: list[Path], split: str, label_dir: Path | None,
                key: str, what: str, hint: str, label_for: Callable[[Path], Path]) -> list[tuple[Path, Path]]:
    """(image, label file) of each image of a split. The label file is ``label_for(base)``, ``base``
    the image's path (suffix kept) under ``label_dir`` as it lies under ``img_dir`` when the YAML
    gives a folder, else :func:`mirror_images` into ``key``; an image with no ``images`` folder to
    mirror is refused, saying where the ``what`` ("masks") are given (``key: {split: hint}``)."""
    if label_dir is not None:
        return [(p, label_for(label_dir / p.relative_to(img_dir))) for p in images]
    pairs = []
    for p in images:
        base = mirror_images(p, key)
        if base is None:
            raise ValueError(f"{yaml_path}: cannot tell where the {what} of '{split}' are: {img_dir} has no "
                             f"'images' folder to mirror; add {key}: {{{split}: {hint}}}")
        pairs.append((p, label_for(base)))
    return pairs


def mirror_images(image: Path, folder: str) -> Path | None:
    """``image`` with its last ``images`` folder replaced by ``folder``, suffix kept (None when the
    path has no ``images`` folder)."""
    parts = list(image.parts)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "images":
            parts[i] = folder
            return Path(*parts)
    return None


def under(root: Path, entry: Any) -> Path:
    """``entry`` (``~`` expanded) under ``root`` unless absolute, normalised."""
    p = Path(os.path.expanduser(os.fspath(entry)))
    return Path(os.path.normpath(p if p.is_absolute() else root / p))
