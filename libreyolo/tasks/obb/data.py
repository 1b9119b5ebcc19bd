"""Oriented-box datasets: YOLO-OBB and DOTA-style text labels, and the built-in ``shapes-obb``.

Each image ``.../images/<split>/x.jpg`` has its labels in ``.../labels/<split>/x.txt``, one
object per row, in either of two forms (told apart per row):

* YOLO-OBB: ``class x1 y1 x2 y2 x3 y3 x4 y4`` - a class id and the four corners normalized to
  the image (values a hair outside [0, 1], as converted DOTA labels have, are clipped);
* DOTA: ``x1 y1 x2 y2 x3 y3 x4 y4 name [difficult]`` - the corners in pixels and the class by its
  name in the YAML's ``names``; DOTA's ``imagesource:`` / ``gsd:`` header lines are skipped.

Each quadrilateral becomes its rotated box (:func:`~.rotated.corners_to_xywhr`). Every problem of
a split (a row of 3 points, a class out of range, an unknown name, a corner far outside the image,
a degenerate box) is collected and reported together, each naming the file and line, before any
training starts.

Samples are served resized to the square network input by the model's own preprocessing (the
letterbox of predict, so training, validation and predict see the same pixels), with a
horizontal flip (probability ``fliplr``). The collate pads each batch's objects to a bucketed row
count, so the loss sees a few fixed shapes.
"""
from __future__ import annotations

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
from ...ops.letterbox import letterbox_params
from ..pose.data import bucket_rows
from .rotated import corners_to_xywhr

BUILTIN_OBB = ("shapes-obb",)
#: how far (normalized) a corner may lie outside the image before it is an error rather than clipped
OUTSIDE_TOLERANCE = 0.02


@dataclass
class ObbSample:
    """One image: its path, (h, w), classes (n,) and corners (n, 4, 2) normalized to the image."""
    path: Path
    hw: tuple[int, int]
    cls: np.ndarray
    corners: np.ndarray


@dataclass
class ObbDataConfig:
    """A resolved oriented-box dataset: classes and the two splits' samples."""
    root: Path
    nc: int
    names: dict[int, str]
    train: list[ObbSample] = field(default_factory=list)
    val: list[ObbSample] = field(default_factory=list)
    source: str = ""


def _number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def parse_obb_labels(text: str, nc: int, names: dict[int, str], hw: tuple[int, int], shown: str
                     ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """One label file's text -> (cls (n,), corners (n, 4, 2) normalized, problems)."""
    h, w = hw
    by_name = {str(v): k for k, v in names.items()}
    cls, quads, problems = [], [], []
    for line_no, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith(("imagesource:", "gsd:")):
            continue
        where = f"{shown}:{line_no}"
        if len(fields) == 9 and all(_number(f) for f in fields):               # YOLO-OBB
            c = float(fields[0])
            if c != int(c) or not 0 <= c < nc:
                problems.append(f"{where}: class {fields[0]} is not an integer in [0, {nc - 1}]")
                continue
            pts = np.array([float(v) for v in fields[1:]], np.float64).reshape(4, 2)
        elif len(fields) in (9, 10) and all(_number(f) for f in fields[:8]) and not _number(fields[8]):   # DOTA
            if fields[8] not in by_name:
                problems.append(f"{where}: class name {fields[8]!r} is not in the dataset's names")
                continue
            c = by_name[fields[8]]
            pts = np.array([float(v) for v in fields[:8]], np.float64).reshape(4, 2) / np.array([w, h])
        else:
            nums = sum(_number(f) for f in fields)
            problems.append(f"{where}: {len(fields)} values, expected 'class x1 y1 x2 y2 x3 y3 x4 y4' (YOLO-OBB: a "
                            "class and 4 corner points, normalized) or 'x1 y1 ... x4 y4 name [difficult]' (DOTA); "
                            f"this row has {max(0, nums - (len(fields) % 2)) // 2} points")
            continue
        if not np.isfinite(pts).all():
            problems.append(f"{where}: a corner is not a finite number")
            continue
        if (pts < -OUTSIDE_TOLERANCE).any() or (pts > 1 + OUTSIDE_TOLERANCE).any():
            problems.append(f"{where}: a corner lies outside the image (normalized coordinates must be in [0, 1])")
            continue
        pts = pts.clip(0.0, 1.0)
        rect = corners_to_xywhr(pts[None] * np.array([w, h]))[0]
        if rect[2] < 1e-6 or rect[3] < 1e-6:
            problems.append(f"{where}: the box has no area")
            continue
        cls.append(int(c))
        quads.append(pts)
    n = len(cls)
    return np.array(cls, np.int64), np.array(quads, np.float32).reshape(n, 4, 2), problems


def resolve_obb_data(data: Any) -> ObbDataConfig:
    """``"shapes-obb"`` (generated on first use) or an oriented-box dataset YAML -> the config."""
    check_data_given(data, BUILTIN_OBB)
    if isinstance(data, str) and data == "shapes-obb":
        from .synthetic import make_shapes_obb_dataset
        cfg = resolve_obb_data(make_shapes_obb_dataset())
        cfg.source = "shapes-obb"
        return cfg
    yaml_path = Path(os.fspath(data))
    if yaml_path.is_dir():
        yaml_path = yaml_path / "data.yaml"
    if not yaml_path.is_file():
        raise FileNotFoundError(f"oriented-box dataset not found: '{data}' (expected 'shapes-obb' or a dataset "
                                "YAML)")
    spec = read_yaml(yaml_path, "path/train/val/names")
    nc, names = names_from_spec(yaml_path, spec)
    if nc is None:
        raise ValueError(f"{yaml_path}: give 'names' (a list or {{id: name}}) or 'nc'")
    names = names or {i: f"class{i}" for i in range(nc)}
    root = Path(spec.get("path") or ".")
    root = root if root.is_absolute() else (yaml_path.parent / root)
    root = Path(os.path.normpath(root))
    problems = DataProblems(root, yaml_path)
    splits: dict[str, list[ObbSample]] = {}
    for split in ("train", "val"):
        if split not in spec:
            raise ValueError(f"{yaml_path}: '{split}' is missing")
        images, found = list_split_images(yaml_path, split, spec[split], root, problems)
        problems.extend(found)
        if not images:
            problems.extend([f"{split}: no images found in {spec[split]!r}"])
        samples = []
        for img in images:
            with Image.open(img) as im:
                w, h = im.size
            lab = label_path_for(img)
            text = lab.read_text() if lab.exists() else ""
            cls, corners, bad = parse_obb_labels(text, nc, names, (h, w), problems.rel(lab))
            problems.extend(bad)
            samples.append(ObbSample(img, (h, w), cls, corners))
        splits[split] = samples
    problems.raise_if_any()
    return ObbDataConfig(root, nc, names, splits["train"], splits["val"], str(yaml_path))


class ObbDataset(torch.utils.data.Dataset):
    """Samples of one split as ``(image uint8 (3, S, S), cls (n,), boxes (n, 5))``: the image through
    the model's preprocessing resize (``prep``), the boxes as cx, cy, w, h normalized to the network
    input and the angle in radians in [0, pi) (longer side first). A horizontal flip with
    probability ``fliplr`` when ``augment``."""

    def __init__(self, samples: list[ObbSample], imgsz: int, prep, augment: bool = False, fliplr: float = 0.5):
        if prep.resize not in ("topleft", "center", "stretch"):
            raise ValueError(f"oriented-box datasets need a square letterbox or stretch preprocessing, not "
                             f"{prep.resize!r}")
        self.samples, self.imgsz, self.prep = samples, int(imgsz), prep
        self.augment, self.fliplr = augment, float(fliplr)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        s = self.samples[i]
        with Image.open(s.path) as im:
            img = np.array(im.convert("RGB"))
        corners = s.corners.astype(np.float64)
        # torch's generator: the DataLoader seeds it per worker and per epoch from the run's seed
        if self.augment and float(torch.rand(())) < self.fliplr:
            img = img[:, ::-1]
            corners = corners.copy()
            corners[..., 0] = 1.0 - corners[..., 0]
        h, w = img.shape[:2]
        size = self.imgsz
        x = self.prep.resize_images(torch.from_numpy(np.ascontiguousarray(img))[None], size)
        image = (x[0] * 255).round().clamp(0, 255).to(torch.uint8)
        p = letterbox_params(h, w, size, self.prep.resize)
        canvas = corners * np.array([p.new_w, p.new_h]) + np.array([p.pad_x, p.pad_y])
        rect = corners_to_xywhr(canvas.reshape(-1, 4, 2)).reshape(-1, 5)
        rect[:, :4] /= size
        return image, torch.from_numpy(s.cls), torch.from_numpy(rect.astype(np.float32))


def collate_obb(batch, bucket: int = 16):
    """-> images (B, 3, S, S) uint8, cls (B, M) long, boxes (B, M, 5), mask (B, M) bool, with M =
    :func:`~libreyolo.tasks.pose.data.bucket_rows` of the batch's largest object count."""
    images = torch.stack([b[0] for b in batch])
    m = bucket_rows(max(len(b[1]) for b in batch), bucket)
    bsz = len(batch)
    cls = torch.zeros(bsz, m, dtype=torch.long)
    boxes = torch.zeros(bsz, m, 5)
    mask = torch.zeros(bsz, m, dtype=torch.bool)
    for i, (_, c, bx) in enumerate(batch):
        n = len(c)
        cls[i, :n], boxes[i, :n], mask[i, :n] = c, bx, True
    return images, cls, boxes, mask
