"""Point datasets: YOLO detection labels (box centres) or point labels, and ``shapes-point``.

Layout and YAML are YOLO detection's::

    root/images/train/a.jpg   root/labels/train/a.txt     # the label file: the image's path with
    root/images/val/b.png     root/labels/val/b.txt       # its last ``images`` folder -> ``labels``

    path: root              # relative paths are relative to the YAML's folder
    train: images/train     # a folder, a .txt list of images, an image, or a list of those
    val: images/val
    names: [person, car]    # or {0: person, 1: car}, or nc: 2

Each label row is, normalized to the image's width and height (values in [0, 1]):

* ``class x y``: a point (the point-label format);
* ``class cx cy w h``: a YOLO box, whose centre is the point (so any YOLO detection dataset
  trains a point model unchanged).

One file may mix both. An image without a label file (or with an empty one) has no point.
Every problem of both splits - a row with another number of values, a class outside the names, a
value that is not a number or lies outside [0, 1], a box without area, an unreadable image - is
collected and raised as ONE ``ValueError`` naming each file and line, before any training.

Samples are served stretched to the square network input as predict resizes them (the model's
``Preprocess``), with a horizontal and an optional vertical flip; the collate gives the centroid
grid the loss trains on - per cell of the ``S / stride`` grid, 0 for background or ``1 + class``
of the point falling in it (where two points share a cell, the later row wins) - and the points
themselves, padded to a bucketed row count, for the metrics.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ...data.datasets import (
    DataProblems,
    check_data_given,
    label_path_for,
    list_split_images,
    names_from_spec,
    read_yaml,
)

__all__ = ["BUILTIN_POINT", "PointData", "PointDataset", "PointSample", "bucket_rows", "collate_point",
           "parse_point_labels", "resolve_point_data"]

BUILTIN_POINT = ("shapes-point",)


@dataclass
class PointSample:
    """One image: its path, classes (n,) and points (n, 2) normalized x, y."""

    path: Path
    cls: np.ndarray
    points: np.ndarray


@dataclass
class PointData:
    """A resolved point dataset: classes and the two splits' samples."""

    root: Path
    nc: int
    names: dict[int, str]
    train: list[PointSample] = field(default_factory=list)
    val: list[PointSample] = field(default_factory=list)
    source: str = ""


def parse_point_labels(path: Path, nc: int, shown: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A label file -> (cls (n,) int64, points (n, 2) float32 normalized, problems); rows of 3
    values are points, rows of 5 YOLO boxes (their centres). A missing file is an image without
    points."""
    cls, pts, problems = [], [], []
    try:
        text = path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        return np.zeros(0, np.int64), np.zeros((0, 2), np.float32), [f"{shown}: cannot read ({e})"]
    for line_no, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        where = f"{shown}:{line_no}"
        if len(fields) not in (3, 5):
            problems.append(f"{where}: {len(fields)} values; a point row is 'class x y' and a box row 'class cx cy "
                            f"w h' (normalized to the image)")
            continue
        try:
            values = [float(v) for v in fields]
        except ValueError:
            problems.append(f"{where}: a value is not a number: {line.strip()!r}")
            continue
        if not all(math.isfinite(v) for v in values):
            problems.append(f"{where}: a value is not finite: {line.strip()!r}")
            continue
        c = values[0]
        if c != int(c) or not 0 <= c < nc:
            problems.append(f"{where}: class {fields[0]} is not an integer in [0, {nc - 1}]")
            continue
        x, y = values[1], values[2]
        if not (0 <= x <= 1 and 0 <= y <= 1):
            problems.append(f"{where}: the point ({x:g}, {y:g}) is outside the image (normalized coordinates "
                            f"must lie in [0, 1])")
            continue
        if len(values) == 5 and not (values[3] > 0 and values[4] > 0):
            problems.append(f"{where}: the box {fields[1:5]} has no area")
            continue
        cls.append(int(c))
        pts.append((x, y))
    n = len(cls)
    return np.array(cls, np.int64), np.array(pts, np.float32).reshape(n, 2), problems


def resolve_point_data(data: Any) -> PointData:
    """``"shapes-point"`` (generated on first use), a dataset YAML or a folder holding
    ``data.yaml`` -> :class:`PointData`; every content problem in one error."""
    if isinstance(data, PointData):
        return data
    check_data_given(data, BUILTIN_POINT)
    if isinstance(data, str) and data == "shapes-point":
        from .synthetic import make_shapes_point_dataset
        cfg = resolve_point_data(make_shapes_point_dataset())
        cfg.source = "shapes-point"
        return cfg
    yaml_path = Path(os.fspath(data)).expanduser()
    if yaml_path.is_dir():
        yaml_path = yaml_path / "data.yaml"
    if not yaml_path.is_file():
        raise FileNotFoundError(f"point dataset not found: '{data}' (expected 'shapes-point', a dataset YAML, or "
                                "a folder holding data.yaml)")
    yaml_path = yaml_path.absolute()
    spec = read_yaml(yaml_path, "path/train/val/names")
    fmt = str(spec.get("format", "yolo")).lower()
    if fmt != "yolo":
        raise ValueError(f"{yaml_path}: the point task reads YOLO-style label files (format: yolo), not {fmt!r}")
    for key in ("train", "val"):
        if spec.get(key) in (None, "", []):
            raise ValueError(f"{yaml_path}: required entry '{key}' is missing")
    nc, names = names_from_spec(yaml_path, spec)
    if nc is None:
        raise ValueError(f"{yaml_path}: give 'names' (a list or {{id: name}}) or 'nc'")
    root = Path(os.path.expanduser(str(spec.get("path") or ".")))
    root = Path(os.path.normpath(root if root.is_absolute() else yaml_path.parent / root))
    if not root.is_dir():
        raise FileNotFoundError(f"{yaml_path}: 'path' folder not found: {root}")
    problems = DataProblems(root, yaml_path)
    splits: dict[str, list[PointSample]] = {}
    for split in ("train", "val"):
        images, found = list_split_images(yaml_path, split, spec[split], root, problems)
        problems.extend(found)
        if not images and not found:
            problems.extend([f"{split}: no images found in {spec[split]!r}"])
        samples = []
        for img in images:
            try:
                with Image.open(img):   # the header parses: a file PIL can decode
                    pass
            except Exception as e:   # UnidentifiedImageError, truncated header, ...
                problems.extend([f"{problems.rel(img)}: cannot read image ({type(e).__name__}: {e})"])
                continue
            lab = label_path_for(img)
            cls, pts, bad = parse_point_labels(lab, nc, problems.rel(lab))
            problems.extend(bad)
            samples.append(PointSample(img, cls, pts))
        splits[split] = samples
    problems.raise_if_any()
    return PointData(root, nc, names or {i: f"class{i}" for i in range(nc)}, splits["train"], splits["val"],
                     str(yaml_path))


class PointDataset(torch.utils.data.Dataset):
    """Samples of one split as ``(image uint8 (3, S, S), cls (n,), points (n, 2))``, normalized
    coordinates, the image resized by ``preprocess`` (predict's own resize: a stretch for FOMO);
    with ``augment`` a horizontal flip (probability ``fliplr``) and a vertical one (``flipud``)."""

    def __init__(self, samples: list[PointSample], imgsz: int, preprocess, augment: bool = False,
                 fliplr: float = 0.5, flipud: float = 0.0):
        if preprocess.resize != "stretch":
            raise ValueError(f"the point datasets serve images stretched to the square (point labels carry no "
                             f"box to letterbox); this model's preprocess resize is {preprocess.resize!r}")
        self.samples, self.imgsz, self.preprocess = samples, int(imgsz), preprocess
        self.augment, self.fliplr, self.flipud = augment, float(fliplr), float(flipud)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        from ...data.sources import decode_image
        s = self.samples[i]
        image = torch.from_numpy(decode_image(s.path))
        x = self.preprocess.resize_images(image.unsqueeze(0), self.imgsz)[0]          # predict's own resize
        x = x.mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)                      # back to the uint8 grid
        pts = s.points.copy()
        # torch's generator: the DataLoader seeds it per worker and per epoch from the run's seed
        if self.augment and self.fliplr > 0 and float(torch.rand(())) < self.fliplr:
            x, pts[:, 0] = x.flip(-1), 1.0 - pts[:, 0]
        if self.augment and self.flipud > 0 and float(torch.rand(())) < self.flipud:
            x, pts[:, 1] = x.flip(-2), 1.0 - pts[:, 1]
        return x.contiguous(), torch.from_numpy(s.cls), torch.from_numpy(pts)


def bucket_rows(n: int, bucket: int) -> int:
    """The padded row count for ``n`` points: ``bucket`` times the next power of two."""
    return bucket * 2 ** max(0, math.ceil(math.log2(max(1, n) / bucket)))


def centroid_grid(cls: torch.Tensor, points: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
    """(gh, gw) int64 grid: 0 = background, ``1 + class`` in the cell each point falls in (the
    later point wins a shared cell)."""
    grid = torch.zeros(gh, gw, dtype=torch.long)
    if len(cls):
        col = (points[:, 0] * gw).floor().long().clamp_(0, gw - 1)
        row = (points[:, 1] * gh).floor().long().clamp_(0, gh - 1)
        for r, c, k in zip(row.tolist(), col.tolist(), cls.tolist()):   # in row order: the later one wins
            grid[r, c] = k + 1
    return grid


def collate_point(batch, stride: int = 8, bucket: int = 16):
    """-> images (B, 3, S, S) uint8, grid (B, S/stride, S/stride) int64 (:func:`centroid_grid`),
    cls (B, M) int64, points (B, M, 2) normalized, mask (B, M) bool, with M = :func:`bucket_rows`
    of the batch's largest point count."""
    images = torch.stack([b[0] for b in batch])
    gh, gw = images.shape[-2] // stride, images.shape[-1] // stride
    m = bucket_rows(max(len(b[1]) for b in batch), bucket)
    bsz = len(batch)
    grid = torch.stack([centroid_grid(c, p, gh, gw) for _, c, p in batch])
    cls = torch.zeros(bsz, m, dtype=torch.long)
    pts = torch.zeros(bsz, m, 2)
    mask = torch.zeros(bsz, m, dtype=torch.bool)
    for i, (_, c, p) in enumerate(batch):
        n = len(c)
        cls[i, :n], pts[i, :n], mask[i, :n] = c, p, True
    return images, grid, cls, pts, mask
