"""Detection datasets: resolve ``data=`` into a validated :class:`DatasetConfig`.

Accepted ``data`` values:

* ``"shapes"``: the built-in synthetic dataset (:mod:`libreyolo.data.synthetic`), generated on
  first use;
* a YOLO-format YAML (or a folder holding ``data.yaml``)::

      path: datasets/coco8     # root; relative paths are relative to the YAML's folder
      train: images/train      # a folder of images (searched recursively), a .txt list of image
      val: [images/val, x.txt] # paths (relative to the root or to the list's folder), or a list
      names: [person, bicycle] # or {0: person, 1: bicycle}; nc may replace or accompany it

  Labels: ``.../images/.../x.jpg`` -> ``.../labels/.../x.txt`` (the last ``images`` component of
  the path becomes ``labels``), one ``cls cx cy w h`` row per object, normalized to [0, 1]. A
  missing or empty label file means an image without objects;
* a COCO-format YAML: ``format: coco``, ``path`` and ``train``/``val`` each
  ``{images: <folder>, annotations: <instances.json>}``. Category ids are mapped to 0..nc-1 in
  sorted id order, names come from the categories, ``iscrowd`` boxes are skipped. Boxes of zero
  or negative size and boxes lying entirely outside their image are skipped with one warning per
  annotation file that names them (index and id); a YOLO row with either is a problem (below).

``data=None`` (or ``""``) is refused: give a dataset or a built-in set's name
(:func:`check_data_given`). Every task reads its dataset YAML through :func:`read_yaml`, which
refuses a file that is not UTF-8 text (an image or a checkpoint given as ``data=``), not valid
YAML, or not a mapping, in one ``ValueError`` naming the file.

Everything is checked before training starts. Structural mistakes (a missing key, folder or file)
raise ``FileNotFoundError`` at once, naming the key and the resolved path. Problems in the content
(bad label rows, out-of-range classes, undecodable images, malformed COCO entries) are collected over
both splits and raised as ONE ``ValueError`` listing up to 20 of them, each naming the file and line,
so that everything can be fixed in one pass.

A split that parsed cleanly is cached (``<labels dir>/../<split>.libreyolo.cache``, or in the
dataset root if that is not writable). The cache is keyed by every image path with the size and
modification time of the image and of its label file, so an unchanged dataset is loaded without
opening a single label file or image, and any change re-parses the split.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image
from tqdm import tqdm

from .sources import IMAGE_EXTENSIONS

__all__ = ["Sample", "DatasetConfig", "resolve_data", "label_path_for", "read_yaml", "check_data_given",
           "MAX_LISTED_PROBLEMS"]

LOGGER = logging.getLogger(__name__)

#: How many problems the single validation error lists before summarizing the rest as a count.
MAX_LISTED_PROBLEMS = 20
#: Tolerance on normalized coordinates: values in [-tol, 1 + tol] are accepted (and clipped).
COORD_TOLERANCE = 1e-3
# v2: images are decoded by the check (v1 caches only saw Image.verify(), which misses truncated
# JPEG data), so a v1 cache is checked again
_CACHE_VERSION = "libreyolo-labels-v2"
_EXIF_ORIENTATION = 274  # EXIF tag; values 5..8 mean the stored image is rotated by 90 degrees


@dataclass
class Sample:
    """One image and its objects.

    ``labels`` is float32 (n, 5): ``[cls, x1, y1, x2, y2]`` with corners normalized to [0, 1] by
    the image width and height. ``width``/``height`` are the size of the image as it is decoded
    (upright, EXIF orientation applied), read from the file header or the COCO json.
    """

    image: Path
    labels: np.ndarray
    width: int
    height: int


@dataclass
class DatasetConfig:
    """A resolved, validated dataset: classes and the samples of each split.

    ``source`` is what was resolved (``"shapes"`` or the YAML path); ``format`` is ``"yolo"`` or
    ``"coco"``.
    """

    root: Path
    nc: int
    names: dict[int, str]
    train: list[Sample]
    val: list[Sample]
    source: str
    format: str = "yolo"
    #: COCO json datasets: each validation image's COCO id (by image path) and the COCO category
    #: id of each class index, for writing predictions in the dataset's own ids (``save_json``)
    image_ids: dict[str, int] = field(default_factory=dict)
    category_ids: list[int] = field(default_factory=list)


#: The built-in detection set(s) ``data=`` may name.
BUILTIN_NAMES = ("shapes",)


def check_data_given(data: Any, builtins: Iterable[str]) -> None:
    """Refuse a missing ``data`` (None, or an empty / blank string, which would otherwise resolve
    to the working directory): a run never falls back to a built-in set unasked. ``builtins``
    are the names of the task's built-in sets, listed in the message."""
    if data is None or (isinstance(data, str) and not data.strip()):
        names = ", ".join(repr(n) for n in builtins)
        raise ValueError(f"data is required: a dataset YAML/folder, or a built-in set by name ({names}); "
                         f"got {data!r}")


def read_yaml(yaml_path: Path, expected: str) -> dict:
    """The mapping of a dataset YAML, the one reader of every task's ``data=`` YAML.

    ``ValueError`` naming the file when it is not UTF-8 text (an image, a checkpoint or another
    binary file: the message says which kind when its first bytes tell), not valid YAML, or not a
    mapping (``expected`` says what the mapping holds, e.g. ``"path/train/val/names"``). A UTF-8
    byte-order mark and UTF-16 with a BOM are read (see :func:`_read_text`).
    """
    try:
        text = _read_text(yaml_path)
        if "\x00" in text:   # valid UTF-8 can still be binary data
            raw = text.encode("utf-8")
            i = raw.index(b"\x00")
            raise UnicodeDecodeError("utf-8", raw, i, i + 1, "a NUL byte, which text files do not hold")
    except UnicodeDecodeError as e:
        raise ValueError(f"{yaml_path}: not a dataset YAML: {_not_text(yaml_path, e)}; data= takes a dataset YAML "
                         "file, a folder holding data.yaml, or a built-in set's name") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{yaml_path}: not valid YAML: {e}") from e
    if not isinstance(spec, dict):
        raise ValueError(f"{yaml_path}: expected a mapping with {expected}, got {type(spec).__name__}")
    return spec


#: First bytes of binary files mistaken for a YAML or text list (what :func:`_not_text` names).
_MAGIC = ((b"\xff\xd8\xff", "a JPEG image"), (b"\x89PNG", "a PNG image"), (b"GIF8", "a GIF image"),
          (b"BM", "a BMP image"), (b"II*\x00", "a TIFF image"), (b"MM\x00*", "a TIFF image"),
          (b"PK\x03\x04", "a zip archive (a .pt checkpoint is one)"), (b"\x80", "a pickle (an old .pt checkpoint)"),
          (b"\x1f\x8b", "a gzip archive"), (b"%PDF", "a PDF document"))


def _not_text(path: Path, e: UnicodeDecodeError) -> str:
    """Why ``path`` is not read as text: the kind of file its first bytes show, else the bad byte."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        head = b""
    kind = next((k for magic, k in _MAGIC if head.startswith(magic)), None)
    if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "a WebP image"
    bad = e.object[e.start:e.start + 1]
    detail = (f"it looks like {kind}" if kind else
              f"byte 0x{bad.hex()} at offset {e.start}: {e.reason}" if bad else e.reason)
    return f"the file is not UTF-8 text ({detail})"


def resolve_data(data: str | os.PathLike) -> DatasetConfig:
    """Resolve ``data`` (see the module docstring) into a validated :class:`DatasetConfig`."""
    check_data_given(data, BUILTIN_NAMES)
    if isinstance(data, str) and data == "shapes":
        from .synthetic import make_shapes_dataset

        cfg = _resolve_yaml(make_shapes_dataset())
        cfg.source = "shapes"
        return cfg
    path = Path(os.fspath(data)).expanduser()
    if path.is_dir() and (path / "data.yaml").is_file():
        path = path / "data.yaml"
    if not path.is_file():
        raise FileNotFoundError(
            f"dataset not found: '{data}' (expected 'shapes', a dataset YAML file, or a folder "
            "holding data.yaml)"
        )
    return _resolve_yaml(path)


def label_path_for(image: Path) -> Path:
    """The YOLO label file of ``image``: the last ``images`` folder becomes ``labels``, suffix
    ``.txt``; without an ``images`` folder, the ``.txt`` next to the image."""
    parts = list(image.parts)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            return Path(*parts).with_suffix(".txt")
    return image.with_suffix(".txt")


# --------------------------------------------------------------------------------------------------
# YAML -> config.


class DataProblems:
    """Collects content problems so that they can be reported together, paths shown short."""

    def __init__(self, root: Path, source: Path):
        self.root = root
        self.source = source
        self.items: list[str] = []

    def rel(self, p: Path) -> str:
        try:
            return Path(os.path.relpath(p, self.root)).as_posix() if _is_under(p, self.root) else str(p)
        except ValueError:  # different drives on Windows
            return str(p)

    def extend(self, items: Iterable[str]) -> None:
        self.items.extend(items)

    def raise_if_any(self) -> None:
        if not self.items:
            return
        n = len(self.items)
        shown = self.items[:MAX_LISTED_PROBLEMS]
        lines = [f"dataset '{self.source}' has {n} problem{'s' if n > 1 else ''} "
                 f"(fix {'them' if n > 1 else 'it'} and run again):"]
        lines += [f"  - {s}" for s in shown]
        if n > len(shown):
            lines.append(f"  ... and {n - len(shown)} more")
        raise ValueError("\n".join(lines))


def _is_under(p: Path, root: Path) -> bool:
    try:
        p.relative_to(root)
        return True
    except ValueError:
        return False


def _resolve_yaml(yaml_path: Path) -> DatasetConfig:
    yaml_path = yaml_path.absolute()
    spec = read_yaml(yaml_path, "path/train/val/names")
    for key in ("path", "train", "val"):
        if spec.get(key) in (None, "", []):
            raise FileNotFoundError(f"{yaml_path}: required entry '{key}' is missing")
    root = Path(os.path.expanduser(str(spec["path"])))
    if not root.is_absolute():
        root = yaml_path.parent / root
    root = Path(os.path.normpath(root))
    if not root.is_dir():
        raise FileNotFoundError(f"{yaml_path}: 'path' folder not found: {root}")
    fmt = str(spec.get("format", "yolo")).lower()
    if fmt == "yolo":
        return _resolve_yolo(yaml_path, spec, root)
    if fmt == "coco":
        return _resolve_coco(yaml_path, spec, root)
    raise ValueError(f"{yaml_path}: unknown format '{spec['format']}' (expected 'yolo' or 'coco')")


def names_from_spec(yaml_path: Path, spec: dict) -> tuple[int | None, dict[int, str] | None]:
    """(nc, names) as given in the YAML, either possibly None; checked for consistency."""
    nc = spec.get("nc")
    if nc is not None and (not isinstance(nc, int) or isinstance(nc, bool) or nc < 1):
        raise ValueError(f"{yaml_path}: 'nc' must be a positive integer, got {nc!r}")
    raw = spec.get("names")
    if raw is None:
        return nc, None
    if isinstance(raw, (list, tuple)):
        names = {i: str(n) for i, n in enumerate(raw)}
    elif isinstance(raw, dict):
        names = {}
        for k, v in raw.items():
            if not (_is_int(k) or (isinstance(k, str) and k.strip().isdigit())):
                raise ValueError(f"{yaml_path}: 'names' key {k!r} is not a class id")
            names[int(k)] = str(v)
        if sorted(names) != list(range(len(names))):
            raise ValueError(f"{yaml_path}: 'names' ids must be 0..{len(names) - 1} without gaps, "
                             f"got {sorted(names)}")
        names = dict(sorted(names.items()))
    else:
        raise ValueError(f"{yaml_path}: 'names' must be a list or a mapping, got {type(raw).__name__}")
    if not names:
        raise ValueError(f"{yaml_path}: 'names' is empty")
    if nc is not None and nc != len(names):
        raise ValueError(f"{yaml_path}: nc={nc} but {len(names)} names are given")
    return len(names), names


def _resolve_yolo(yaml_path: Path, spec: dict, root: Path) -> DatasetConfig:
    nc, names = names_from_spec(yaml_path, spec)
    if nc is None:
        raise ValueError(f"{yaml_path}: give 'names' (a list or {{id: name}}) or 'nc'")
    names = names or {i: f"class{i}" for i in range(nc)}
    problems = DataProblems(root, yaml_path)
    splits: dict[str, list[Sample]] = {}
    for split in ("train", "val"):
        images, list_problems = _list_split_images(yaml_path, split, spec[split], root, problems)
        problems.extend(list_problems)
        if not images and not list_problems:
            problems.extend([f"{split}: no images found in {spec[split]!r}"])
        splits[split] = _load_yolo_split(split, images, nc, root, problems) if images else []
    problems.raise_if_any()
    _log_summary(splits)
    return DatasetConfig(root=root, nc=nc, names=names, train=splits["train"], val=splits["val"],
                         source=str(yaml_path), format="yolo")


def _list_split_images(yaml_path: Path, split: str, entry: Any, root: Path,
                       problems: DataProblems) -> tuple[list[Path], list[str]]:
    """Image paths of one split entry (folder, .txt list, image file, or a list of those)."""
    entries = entry if isinstance(entry, (list, tuple)) else [entry]
    images: list[Path] = []
    found: list[str] = []
    for i, item in enumerate(entries):
        key = f"{split}[{i}]" if isinstance(entry, (list, tuple)) else split
        if not isinstance(item, (str, os.PathLike)):
            raise ValueError(f"{yaml_path}: '{key}' must be a path, got {type(item).__name__}")
        p = Path(os.path.expanduser(os.fspath(item)))
        p = Path(os.path.normpath(p if p.is_absolute() else root / p))
        if p.is_dir():
            images.extend(sorted(q for q in p.rglob("*") if is_image_path(q)))
        elif p.is_file() and p.suffix.lower() == ".txt":
            found.extend(_read_image_list(p, root, images, problems))
        elif p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS:
            images.append(p)
        elif p.exists():
            raise ValueError(f"{yaml_path}: '{key}' is neither a folder, a .txt list nor an image: {p}")
        else:
            raise FileNotFoundError(f"{yaml_path}: '{key}' not found: {p}")
    return images, found


#: the image paths of a split entry of a dataset YAML (other tasks' YOLO-style readers use it)
list_split_images = _list_split_images


def is_image_path(p: Path) -> bool:
    return p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".") and p.is_file()


def _read_image_list(list_file: Path, root: Path, out: list[Path], problems: DataProblems) -> list[str]:
    """Append the images named in a .txt list to ``out``; return a problem per missing entry."""
    found = []
    try:
        text = _read_text(list_file)
    except UnicodeDecodeError as e:
        return [f"{problems.rel(list_file)}: cannot read the image list: {_not_text(list_file, e)}"]
    for n, line in enumerate(text.splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        p = Path(os.path.expanduser(text))
        if not p.is_absolute():
            # Relative to the dataset root; entries written as ./x relative to the list also work.
            cand = Path(os.path.normpath(root / p))
            p = cand if cand.exists() else Path(os.path.normpath(list_file.parent / p))
            if not p.exists():
                p = cand
        if not p.is_file():
            found.append(f"{problems.rel(list_file)} line {n}: image not found: {p}")
        elif p.suffix.lower() not in IMAGE_EXTENSIONS:
            found.append(f"{problems.rel(list_file)} line {n}: not an image file: {p}")
        else:
            out.append(p)
    return found


def _log_summary(splits: dict[str, list[Sample]]) -> None:
    for split, samples in splits.items():
        boxes = sum(len(s.labels) for s in samples)
        empty = sum(1 for s in samples if len(s.labels) == 0)
        LOGGER.info("%s: %d images, %d boxes, %d images without objects", split, len(samples),
                    boxes, empty)


# --------------------------------------------------------------------------------------------------
# Parsing one YOLO split (with the cache).


def _stat_key(p: Path) -> str:
    try:
        st = p.stat()
        return f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return "-"


def _load_yolo_split(split: str, images: list[Path], nc: int, root: Path,
                     problems: DataProblems) -> list[Sample]:
    labels = [label_path_for(p) for p in images]
    h = hashlib.sha256(f"{_CACHE_VERSION}|yolo|nc={nc}\n".encode())
    for img, lab in zip(images, labels):
        h.update(f"{img}|{_stat_key(img)}|{lab}|{_stat_key(lab)}\n".encode())
    key = h.hexdigest()
    label_dirs = sorted({str(p.parent) for p in labels})
    common = Path(os.path.commonpath(label_dirs)) if label_dirs else root
    cache_file = common.parent / f"{split}.libreyolo.cache"
    cached = _read_cache([cache_file, root / f"{split}.libreyolo.cache"], key, images)
    if cached is not None:
        LOGGER.debug("%s: labels loaded from cache", split)
        return cached

    def work(i: int) -> tuple[Sample | None, list[str]]:
        found: list[str] = []
        size = _inspect_image(images[i], problems, found)
        rows = _parse_yolo_label_file(labels[i], nc, problems, found)
        if size is None or rows is None:
            return None, found
        return Sample(images[i], rows, size[0], size[1]), found

    samples, split_problems = _gather(parallel_map(work, len(images), f"{split} labels"))
    problems.extend(split_problems)
    if not split_problems:
        _write_cache([cache_file, root / f"{split}.libreyolo.cache"], key, samples)
    return samples


def _gather(results) -> tuple[list[Sample], list[str]]:
    """Split (sample or None, problems) pairs into the samples and all problems, in order."""
    samples: list[Sample] = []
    found: list[str] = []
    for sample, errs in results:
        found.extend(errs)
        if sample is not None:
            samples.append(sample)
    return samples, found


def parallel_map(fn: Callable[[int], Any], n: int, desc: str) -> list[Any]:
    """``[fn(i) for i in range(n)]`` on a thread pool (file I/O and PIL release the GIL)."""
    workers = min(8, os.cpu_count() or 1, max(1, n // 64))
    bar = tqdm(total=n, desc=desc, unit="file", leave=False, disable=n < 1000)
    try:
        if workers <= 1:
            out = []
            for i in range(n):
                out.append(fn(i))
                bar.update()
            return out
        with ThreadPoolExecutor(workers) as pool:
            out = []
            for r in pool.map(fn, range(n), chunksize=64):
                out.append(r)
                bar.update()
            return out
    finally:
        bar.close()


def _inspect_image(path: Path, problems: DataProblems, found: list[str]) -> tuple[int, int] | None:
    """(width, height) of the upright image, after checking its structure (``verify()``: PNG
    chunk checksums, ...) and decoding it: ``verify()`` alone does not read JPEG data, so a
    truncated JPEG would pass and end the run at its first batch.

    JPEGs are decoded at 1/8 scale (``draft``: libjpeg skips most of the inverse DCT but still
    reads every byte of entropy-coded data, so truncation and corruption surface); other formats
    are decoded in full. This runs once per image and file change: the result is cached.
    """
    try:
        with Image.open(path) as im:
            im.verify()  # must come right after open(); the image cannot be loaded after it
        with Image.open(path) as im:
            w, h = im.size  # before draft(), which shrinks the decoded size
            if im.format == "JPEG":
                im.draft("RGB", (max(1, w // 8), max(1, h // 8)))
            im.load()
            orientation = exif_orientation(im.info.get("exif"))
    except Exception as e:  # UnidentifiedImageError, truncated or corrupt data, bombs, ...
        found.append(f"{problems.rel(path)}: cannot decode image ({type(e).__name__}: {e})")
        return None
    if w < 1 or h < 1:
        found.append(f"{problems.rel(path)}: image has zero size {w}x{h}")
        return None
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


def exif_orientation(raw: bytes | None) -> int:
    """The EXIF orientation tag from the raw EXIF block of the header (1 when absent)."""
    if not raw:
        return 1
    try:
        exif = Image.Exif()
        exif.load(raw)
        return int(exif.get(_EXIF_ORIENTATION, 1))
    except Exception:  # a damaged EXIF block: decoding ignores it as well
        return 1


def _parse_yolo_label_file(path: Path, nc: int, problems: DataProblems,
                           found: list[str]) -> np.ndarray | None:
    """Rows of a YOLO label file as float32 (n, 5) xyxy-normalized; None if any row is bad."""
    try:
        text = _read_text(path).replace(_BOM, "")  # also BOMs left inside by concatenated files
    except FileNotFoundError:
        return np.zeros((0, 5), np.float32)
    except (OSError, UnicodeDecodeError) as e:
        found.append(f"{problems.rel(path)}: cannot read label file ({e})")
        return None
    where = problems.rel(path)
    rows: list[list[float]] = []
    ok = True
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        msg = _check_row(fields, nc)
        if msg is not None:
            found.append(f"{where} line {n}: {msg}")
            ok = False
            continue
        c, cx, cy, w, h = (float(v) for v in fields)
        rows.append([c, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    if not ok:
        return None
    arr = np.asarray(rows, np.float32).reshape(-1, 5)
    return _clean_boxes(arr)


def _check_row(fields: list[str], nc: int) -> str | None:
    """Why a ``cls cx cy w h`` row is invalid, or None when it is fine."""
    if len(fields) != 5:
        hint = (" (an instance-segmentation polygon row: polygon labels train a segment model, e.g. "
                "LibreYOLO.new('rtmdet', 't', task='segment'))") if len(fields) > 5 else ""
        return f"expected 5 values 'class cx cy w h', got {len(fields)}{hint}"
    try:
        values = [float(v) for v in fields]
    except ValueError:
        bad = next(v for v in fields if not _is_float(v))
        return f"'{bad}' is not a number"
    if not all(math.isfinite(v) for v in values):
        return "non-finite value"
    c, cx, cy, w, h = values
    if c != int(c) or c < 0:
        return f"class '{fields[0]}' is not a non-negative integer"
    if int(c) >= nc:
        return f"class {int(c)} out of range for nc={nc}"
    if w <= 0 or h <= 0:
        return f"zero or negative box size w={fields[3]} h={fields[4]}"
    for k, name in enumerate(("cx", "cy", "w", "h"), 1):
        if not -COORD_TOLERANCE <= values[k] <= 1 + COORD_TOLERANCE:
            return (f"{name}={fields[k]} outside [0, 1] (coordinates must be normalized by the "
                    "image size)")
    if _outside_image(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2):
        return f"box cx={fields[1]} cy={fields[2]} w={fields[3]} h={fields[4]} lies entirely outside the image"
    return None


def _outside_image(x1: float, y1: float, x2: float, y2: float) -> bool:
    """Whether a box (corners normalized by the image size) has no area inside the image: the
    rule for every format (:func:`_clean_boxes` would drop it silently)."""
    return min(x2, 1.0) <= max(x1, 0.0) or min(y2, 1.0) <= max(y1, 0.0)


_BOM = "\ufeff"


def _read_text(path: Path) -> str:
    """A text file as str: UTF-8 with or without a byte-order mark (editors on Windows write
    one; left in, it makes the first value of a label file '\\ufeff0', not a number), or UTF-16
    when it starts with a UTF-16 BOM. Other bytes raise ``UnicodeDecodeError``."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raw = path.read_bytes()
        if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
            return raw.decode("utf-16")
        raise


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _clean_boxes(arr: np.ndarray) -> np.ndarray:
    """Clip xyxy-normalized boxes to [0, 1], drop degenerate and exactly duplicated rows."""
    if len(arr) == 0:
        return np.zeros((0, 5), np.float32)
    arr[:, 1:] = np.clip(arr[:, 1:], 0.0, 1.0)
    keep = (arr[:, 3] > arr[:, 1]) & (arr[:, 4] > arr[:, 2])
    arr = arr[keep]
    if len(arr) > 1:
        _, first = np.unique(arr, axis=0, return_index=True)
        if len(first) < len(arr):
            arr = arr[np.sort(first)]
    return np.ascontiguousarray(arr, dtype=np.float32)


# --------------------------------------------------------------------------------------------------
# Cache.


def _read_cache(candidates: list[Path], key: str, images: list[Path]) -> list[Sample] | None:
    """Samples from the first cache file whose key matches, else None."""
    for path in candidates:
        if not path.is_file():
            continue
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["version"]) != _CACHE_VERSION or str(z["key"]) != key:
                    continue
                paths, wh, counts, labels = z["paths"], z["wh"], z["counts"], z["labels"]
        except Exception as e:  # a corrupt or foreign file: ignore it, it will be rewritten
            LOGGER.debug("ignoring unreadable label cache %s: %s", path, e)
            continue
        if len(paths) != len(images) or any(str(a) != str(b) for a, b in zip(paths, images)):
            continue
        offsets = np.concatenate([[0], np.cumsum(counts)])
        return [Sample(images[i], labels[offsets[i]:offsets[i + 1]].copy(), int(wh[i, 0]),
                       int(wh[i, 1])) for i in range(len(images))]
    return None


def _write_cache(candidates: list[Path], key: str, samples: list[Sample]) -> None:
    """Write the cache atomically to the first writable candidate; warn if none is."""
    labels = (np.concatenate([s.labels for s in samples]) if samples
              else np.zeros((0, 5), np.float32)).astype(np.float32)
    arrays = dict(
        version=np.array(_CACHE_VERSION), key=np.array(key),
        paths=np.array([str(s.image) for s in samples], dtype=str),
        wh=np.array([[s.width, s.height] for s in samples], dtype=np.int64).reshape(-1, 2),
        counts=np.array([len(s.labels) for s in samples], dtype=np.int64),
        labels=labels.reshape(-1, 5),
    )
    for path in dict.fromkeys(candidates):
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, path)
            LOGGER.debug("label cache written to %s", path)
            return
        except OSError as e:
            LOGGER.debug("cannot write label cache %s: %s", path, e)
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
    LOGGER.warning("could not write a label cache (tried %s); labels will be parsed again next time",
                   ", ".join(str(p) for p in dict.fromkeys(candidates)))


# --------------------------------------------------------------------------------------------------
# COCO.


@dataclass
class _CocoSplit:
    images_dir: Path
    annotations: Path
    categories: list[tuple[int, str]] = field(default_factory=list)


def _resolve_coco(yaml_path: Path, spec: dict, root: Path) -> DatasetConfig:
    nc_spec, names_spec = names_from_spec(yaml_path, spec)
    splits: dict[str, _CocoSplit] = {}
    for split in ("train", "val"):
        entry = spec[split]
        if not isinstance(entry, dict):
            raise ValueError(f"{yaml_path}: '{split}' must be {{images: <folder>, annotations: "
                             f"<file.json>}} for format: coco, got {entry!r}")
        for sub in ("images", "annotations"):
            if entry.get(sub) in (None, ""):
                raise FileNotFoundError(f"{yaml_path}: required entry '{split}.{sub}' is missing")
        img_dir = Path(os.path.normpath(root / os.path.expanduser(str(entry["images"]))))
        ann = Path(os.path.normpath(root / os.path.expanduser(str(entry["annotations"]))))
        if not img_dir.is_dir():
            raise FileNotFoundError(f"{yaml_path}: '{split}.images' folder not found: {img_dir}")
        if not ann.is_file():
            raise FileNotFoundError(f"{yaml_path}: '{split}.annotations' file not found: {ann}")
        splits[split] = _CocoSplit(img_dir, ann)

    problems = DataProblems(root, yaml_path)
    docs = {s: _load_json(sp.annotations, problems) for s, sp in splits.items()}
    train_cats = _coco_categories(docs["train"], splits["train"].annotations, problems)
    val_cats = _coco_categories(docs["val"], splits["val"].annotations, problems)
    if not train_cats:  # None: the problem is already recorded; []: record it
        if train_cats is not None:
            problems.extend([f"{problems.rel(splits['train'].annotations)}: no categories"])
        problems.raise_if_any()
    cat_ids = [cid for cid, _ in train_cats]
    if val_cats is not None and [c for c, _ in val_cats] != cat_ids:
        problems.extend([f"{problems.rel(splits['val'].annotations)}: category ids "
                         f"{[c for c, _ in val_cats]} differ from the train categories {cat_ids}"])
    nc = len(cat_ids)
    if nc_spec is not None and nc_spec != nc:
        raise ValueError(f"{yaml_path}: nc={nc_spec} but {splits['train'].annotations} has "
                         f"{nc} categories")
    names = names_spec or {i: name for i, (_, name) in enumerate(train_cats)}
    cat_map = {cid: i for i, cid in enumerate(cat_ids)}

    out: dict[str, list[Sample]] = {}
    for split, sp in splits.items():
        doc = docs[split]
        out[split] = _load_coco_split(split, sp, doc, cat_map, root, problems) if doc else []
        if doc and not out[split] and not problems.items:
            problems.extend([f"{problems.rel(sp.annotations)}: no images"])
    problems.raise_if_any()
    _log_summary(out)
    val_ids = {str(Path(os.path.normpath(splits["val"].images_dir / im["file_name"]))): im["id"]
               for im in (docs["val"] or {}).get("images", [])}
    return DatasetConfig(root=root, nc=nc, names=names, train=out["train"], val=out["val"],
                         source=str(yaml_path), format="coco", image_ids=val_ids, category_ids=list(cat_ids))


def _load_json(path: Path, problems: DataProblems) -> dict | None:
    try:
        doc = json.loads(_read_text(path))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        problems.extend([f"{problems.rel(path)}: not valid JSON ({e})"])
        return None
    if not isinstance(doc, dict):
        problems.extend([f"{problems.rel(path)}: expected a JSON object, got {type(doc).__name__}"])
        return None
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(doc.get(k), list)]
    if missing:
        problems.extend([f"{problems.rel(path)}: missing or non-list key(s) {', '.join(missing)}"])
        return None
    return doc


def _coco_categories(doc: dict | None, path: Path,
                     problems: DataProblems) -> list[tuple[int, str]] | None:
    """Sorted (id, name) pairs of the categories, or None if the json is unusable."""
    if doc is None:
        return None
    where = problems.rel(path)
    cats: dict[int, str] = {}
    ok = True
    for i, c in enumerate(doc["categories"]):
        if not isinstance(c, dict) or not _is_int(c.get("id")) or "name" not in c:
            problems.extend([f"{where}: categories[{i}]: needs an integer 'id' and a 'name'"])
            ok = False
        elif c["id"] in cats:
            problems.extend([f"{where}: categories[{i}]: duplicate id {c['id']}"])
            ok = False
        else:
            cats[int(c["id"])] = str(c["name"])
    return sorted(cats.items()) if ok else None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _load_coco_split(split: str, sp: _CocoSplit, doc: dict, cat_map: dict[int, int], root: Path,
                     problems: DataProblems) -> list[Sample]:
    where = problems.rel(sp.annotations)
    found: list[str] = []
    entries: dict[int, tuple[Path, int, int]] = {}
    for i, im in enumerate(doc["images"]):
        if (not isinstance(im, dict) or not _is_int(im.get("id")) or not isinstance(im.get("file_name"), str)
                or not _is_int(im.get("width")) or not _is_int(im.get("height"))
                or im["width"] < 1 or im["height"] < 1):
            found.append(f"{where}: images[{i}]: needs integer 'id', 'file_name', positive integer "
                         "'width' and 'height'")
        elif im["id"] in entries:
            found.append(f"{where}: images[{i}]: duplicate image id {im['id']}")
        else:
            entries[im["id"]] = (Path(os.path.normpath(sp.images_dir / im["file_name"])),
                                 im["width"], im["height"])
    boxes: dict[int, list[list[float]]] = {k: [] for k in entries}
    zero_size: list[str] = []   # skipped boxes, each as "annotations[i] (id N)"
    outside: list[str] = []
    for i, a in enumerate(doc["annotations"]):
        tag = f"{where}: annotations[{i}]" + (f" (id {a['id']})" if isinstance(a, dict) and "id" in a else "")
        if not isinstance(a, dict) or "image_id" not in a or "category_id" not in a or "bbox" not in a:
            found.append(f"{tag}: needs 'image_id', 'category_id' and 'bbox'")
            continue
        if not _is_int(a["image_id"]) or a["image_id"] not in entries:
            found.append(f"{tag}: unknown image_id {a['image_id']!r}")
            continue
        if not _is_int(a["category_id"]) or a["category_id"] not in cat_map:
            found.append(f"{tag}: unknown category_id {a['category_id']!r}")
            continue
        bb = a["bbox"]
        if not isinstance(bb, list) or len(bb) != 4 or not all(_is_num(v) for v in bb):
            found.append(f"{tag}: bbox must be 4 numbers [x, y, w, h], got {bb!r}")
            continue
        if a.get("iscrowd"):
            continue
        _, w, h = entries[a["image_id"]]
        x, y, bw, bh = (float(v) for v in bb)
        ref = f"annotations[{i}]" + (f" (id {a['id']})" if "id" in a else "")
        if bw <= 0 or bh <= 0:  # real COCO files hold a few of these; skip, do not fail
            zero_size.append(ref)
            continue
        box = [x / w, y / h, (x + bw) / w, (y + bh) / h]
        if _outside_image(*box):   # skipped, but said (clipping would drop it without a word)
            outside.append(f"{ref} bbox {bb} on image {a['image_id']} ({w}x{h})")
            continue
        boxes[a["image_id"]].append([cat_map[a["category_id"]], *box])
    for what, refs in (("with zero or negative width/height", zero_size),
                       ("lying entirely outside their image", outside)):
        if refs:
            shown = refs[:MAX_LISTED_PROBLEMS]
            more = f", ... and {len(refs) - len(shown)} more" if len(refs) > len(shown) else ""
            LOGGER.warning("%s: skipped %d annotation(s) %s: %s%s", where, len(refs), what, ", ".join(shown), more)

    ids = sorted(entries)
    images = [entries[k][0] for k in ids]
    present = [p.is_file() for p in images]
    found.extend(f"{where}: image not found: {p}" for p, ok in zip(images, present) if not ok)

    h = hashlib.sha256(f"{_CACHE_VERSION}|coco|{sp.annotations}|{_stat_key(sp.annotations)}|"
                       f"{sorted(cat_map.items())}\n".encode())
    for p in images:
        h.update(f"{p}|{_stat_key(p)}\n".encode())
    key = h.hexdigest()
    candidates = [sp.annotations.parent / f"{split}.libreyolo.cache", root / f"{split}.libreyolo.cache"]
    cached = None if found else _read_cache(candidates, key, images)
    if cached is not None:
        return cached

    # With problems in the json, the images are still checked: everything is reported in one pass.
    def work(i: int) -> tuple[Sample | None, list[str]]:
        errs: list[str] = []
        path, w, h = entries[ids[i]]
        if not present[i]:
            return None, errs
        size = _inspect_image(path, problems, errs)
        if size is None:
            return None, errs
        if size != (w, h):
            errs.append(f"{where}: image id {ids[i]}: json says {w}x{h} but {problems.rel(path)} "
                        f"is {size[0]}x{size[1]} (after EXIF orientation)")
            return None, errs
        arr = np.asarray(boxes[ids[i]], np.float32).reshape(-1, 5)
        return Sample(path, _clean_boxes(arr), w, h), errs

    samples, errs = _gather(parallel_map(work, len(ids), f"{split} images"))
    found.extend(errs)
    problems.extend(found)
    if not found:
        _write_cache(candidates, key, samples)
    return samples
