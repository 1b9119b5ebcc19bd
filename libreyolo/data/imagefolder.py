"""Classification datasets: resolve ``data=`` into a validated :class:`ClassifyData`.

Accepted ``data`` values:

* ``"shapes-cls"`` (or ``"shapes"`` for a classification model): the built-in synthetic set
  (:mod:`libreyolo.data.shapes_cls`), generated on first use;
* an ImageFolder root: a folder holding ``train/<class>/*.jpg`` and ``val/<class>/*.jpg``;
* a YAML file (or a folder holding ``data.yaml``)::

      path: datasets/flowers   # root; relative paths are relative to the YAML's folder
      train: train             # folders of class folders, relative to the root
      val: val
      names: [daisy, rose]     # optional; or {0: daisy, 1: rose}

  Without ``names`` the classes are the train split's class folders in sorted order; with them,
  class k is the folder named ``names[k]``.

Images may sit in sub-folders of a class folder. Hidden files and folders (``.name``) are ignored.
Everything is checked before training starts, and the problems of both splits are raised as ONE
``ValueError`` (up to :data:`MAX_LISTED_PROBLEMS`, each naming its path): a class folder without
images, a file in a class folder that is not an image (every file's header is decoded), an image
outside any class folder, a val class that the train split does not have. A missing root, split
folder or YAML key is a ``FileNotFoundError`` / ``ValueError`` naming it.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from ..models.common.names import normalize_names
from .datasets import check_data_given, read_yaml
from .sources import IMAGE_EXTENSIONS

__all__ = ["ClassifyData", "MAX_LISTED_PROBLEMS", "resolve_classify_data", "scan_split"]

LOGGER = logging.getLogger(__name__)

#: How many problems the single validation error lists before summarizing the rest as a count.
MAX_LISTED_PROBLEMS = 20
BUILTIN_NAMES = ("shapes-cls", "shapes")


@dataclass
class ClassifyData:
    """A resolved classification dataset: class names and the (image, class) pairs of each split."""

    source: str
    root: Path
    names: dict[int, str]
    train: list[tuple[Path, int]] = field(default_factory=list)
    val: list[tuple[Path, int]] = field(default_factory=list)

    @property
    def nc(self) -> int:
        return len(self.names)


def resolve_classify_data(data: Any) -> ClassifyData:
    """``data`` (see the module docstring) -> a checked :class:`ClassifyData`."""
    if isinstance(data, ClassifyData):
        return data
    check_data_given(data, BUILTIN_NAMES)
    if isinstance(data, str) and data in BUILTIN_NAMES:
        from .shapes_cls import make_shapes_cls_dataset
        out = _resolve_yaml(make_shapes_cls_dataset())
        out.source = "shapes-cls"
        return out
    if not isinstance(data, (str, os.PathLike)):
        raise TypeError(f"data must be a dataset YAML, an ImageFolder root or 'shapes-cls', got {type(data).__name__}")
    path = Path(data).expanduser()
    if path.is_dir():
        if (path / "data.yaml").is_file():
            return _resolve_yaml(path / "data.yaml")
        if (path / "train").is_dir():
            return _resolve_root(path, path / "train", path / "val", None, str(path))
        raise FileNotFoundError(f"'{path}' is neither an ImageFolder root (no 'train' folder in it) nor a folder "
                                "holding data.yaml")
    if path.is_file():
        return _resolve_yaml(path)
    raise FileNotFoundError(f"dataset not found: '{data}' (expected 'shapes-cls', a dataset YAML file, or an "
                            "ImageFolder root with train/<class>/ and val/<class>/ folders)")


def _resolve_yaml(path: Path) -> ClassifyData:
    cfg = read_yaml(path, "train/val (and optionally path, names)")
    root = Path(cfg.get("path") or ".").expanduser()
    if not root.is_absolute():
        root = path.parent / root
    splits = {}
    for key in ("train", "val"):
        if not isinstance(cfg.get(key), str):
            raise ValueError(f"dataset YAML '{path}': '{key}' must name a folder (relative to the root '{root}'), "
                             f"got {cfg.get(key)!r}")
        splits[key] = root / cfg[key]
    return _resolve_root(root, splits["train"], splits["val"], cfg.get("names"), str(path))


def _resolve_root(root: Path, train: Path, val: Path, names: Any, source: str) -> ClassifyData:
    for split, folder in (("train", train), ("val", val)):
        if not folder.is_dir():
            raise FileNotFoundError(f"the {split} split folder '{folder}' does not exist")
    problems: list[str] = []
    train_classes = _class_folders(train)
    if names is None:
        names = {i: n for i, n in enumerate(sorted(train_classes))}
        if not names:
            raise ValueError(f"the train split '{train}' has no class folders (expected train/<class>/<image>)")
    else:
        names = normalize_names(names, len(names))
        for n in names.values():
            if n not in train_classes:
                problems.append(f"class '{n}' (in names) has no folder '{train / n}'")
    index = {n: i for i, n in names.items()}
    out = ClassifyData(source, root, dict(names))
    out.train = scan_split(train, index, problems)
    out.val = scan_split(val, index, problems, missing="val")
    if problems:
        listed = "\n  ".join(problems[:MAX_LISTED_PROBLEMS])
        more = len(problems) - MAX_LISTED_PROBLEMS
        raise ValueError(f"dataset {source}: {len(problems)} problem(s):\n  {listed}"
                         + (f"\n  ... and {more} more" if more > 0 else ""))
    LOGGER.debug("classification dataset %s: %d classes, %d train / %d val images", source, out.nc,
                 len(out.train), len(out.val))
    return out


def _visible(p: Path | str) -> bool:
    return not (p if isinstance(p, str) else p.name).startswith(".")


def _class_folders(split: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted(split.iterdir()) if p.is_dir() and _visible(p)}


def scan_split(split: Path, index: dict[str, int], problems: list[str], missing: str = "train"
               ) -> list[tuple[Path, int]]:
    """The (image, class) pairs of one split folder; problems are appended to ``problems``.

    ``index`` maps class folder names to class ids; a class folder missing from it is a problem
    (``missing="val"``: a val class the train split lacks; else a folder not in the names). Every file's header is decoded (threaded).
    """
    samples: list[tuple[Path, int]] = []
    for p in sorted(split.iterdir()):
        if p.is_file() and _visible(p) and p.suffix.lower() in IMAGE_EXTENSIONS:
            problems.append(f"image '{p}' is not inside a class folder ({split}/<class>/<image>)")
    for name, folder in _class_folders(split).items():
        if name not in index:
            problems.append(f"val class folder '{folder}' has no counterpart in the train split "
                            f"(classes: {', '.join(sorted(index))})" if missing == "val" else
                            f"class folder '{folder}' is not in the dataset's names")
            continue
        files = [f for f in sorted(folder.rglob("*"))
                 if f.is_file() and all(_visible(part) for part in f.relative_to(folder).parts)]
        images = [f for f in files if f.suffix.lower() in IMAGE_EXTENSIONS]
        problems += [f"'{f}' is not an image (suffix '{f.suffix}'; images: {', '.join(sorted(IMAGE_EXTENSIONS))})"
                     for f in files if f.suffix.lower() not in IMAGE_EXTENSIONS]
        if not images:
            problems.append(f"class folder '{folder}' holds no images")
        samples += [(f, index[name]) for f in images]
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) + 2)) as pool:
        for err in pool.map(_check_image, [f for f, _ in samples]):
            if err:
                problems.append(err)
    return samples


def _check_image(path: Path) -> str | None:
    """None when ``path`` has a decodable image header, else the problem (naming the file)."""
    try:
        with Image.open(path) as im:
            im.verify()
    except Exception as e:  # UnidentifiedImageError, truncated headers, ...
        return f"'{path}' is not a decodable image: {e}"
    return None
