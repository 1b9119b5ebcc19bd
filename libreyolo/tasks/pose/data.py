"""Pose datasets: YOLO-pose labels (``kpt_shape``, ``flip_idx`` in the YAML) and ``shapes-pose``.

A label row is ``cls cx cy w h`` then ``kpt_shape[0]`` keypoints of ``kpt_shape[1]`` values
(``x y`` or ``x y v``), all normalized to the image. Every problem of a split (a row with more or
fewer keypoint values than ``kpt_shape`` says, a keypoint outside the image, a bad class or box)
is collected and reported together, each naming the file and line, before any training starts.

The YAML may also give ``skeleton`` (pairs of keypoint indices, for drawing) and ``kpt_sigmas``
(per-keypoint OKS sigmas); a 17-keypoint set without them gets COCO's.

Samples are served resized to the square network input (the stretch of the EC family's
preprocessing), with a horizontal flip (probability ``fliplr``) that swaps left and right
keypoints by ``flip_idx``. The collate pads each batch's instances to a bucketed row count (a
multiple of ``bucket`` times a power of two), so the loss sees a few fixed shapes.
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
from .results import COCO_FLIP_IDX, COCO_SIGMAS, default_skeleton

BUILTIN_POSE = ("shapes-pose",)


@dataclass
class PoseSample:
    """One image: its path, (h, w), classes (n,), boxes (n, 4) normalized cxcywh and keypoints
    (n, K, 3) normalized x, y and visibility (0: not labelled, 1: occluded, 2: visible)."""
    path: Path
    hw: tuple[int, int]
    cls: np.ndarray
    boxes: np.ndarray
    kpts: np.ndarray


@dataclass
class PoseDataConfig:
    """A resolved pose dataset: classes, keypoint layout and the two splits' samples."""
    root: Path
    nc: int
    names: dict[int, str]
    kpt_shape: tuple[int, int]
    flip_idx: tuple[int, ...]
    skeleton: tuple[tuple[int, int], ...]
    sigmas: tuple[float, ...]
    train: list[PoseSample] = field(default_factory=list)
    val: list[PoseSample] = field(default_factory=list)
    source: str = ""


def parse_pose_labels(path: Path, nc: int, kpt_shape: tuple[int, int], shown: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """A YOLO-pose label file -> (cls (n,), boxes (n, 4), keypoints (n, K, 3), problems).

    Keypoints given as ``x y`` get visibility 2. A keypoint with visibility 0 may hold any
    coordinates (it is not labelled); a labelled one must lie inside the image ([0, 1]).
    """
    k, dims = kpt_shape
    want = 5 + k * dims
    cls, boxes, kpts, problems = [], [], [], []
    text = path.read_text() if path.exists() else ""
    for line_no, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        where = f"{shown}:{line_no}"
        if len(fields) != want:
            extra = (len(fields) - 5) / dims if len(fields) > 5 else 0
            problems.append(f"{where}: {len(fields)} values, expected {want} (class, box and {k} keypoints of {dims} "
                            f"values as kpt_shape {list(kpt_shape)} says; this row has {extra:g} keypoints)")
            continue
        try:
            values = [float(v) for v in fields]
        except ValueError:
            problems.append(f"{where}: a value is not a number: {line.strip()!r}")
            continue
        c = values[0]
        if c != int(c) or not 0 <= c < nc:
            problems.append(f"{where}: class {fields[0]} is not an integer in [0, {nc - 1}]")
            continue
        box = np.array(values[1:5], np.float32)
        if not np.all(np.isfinite(box)) or box[2] <= 0 or box[3] <= 0:
            problems.append(f"{where}: the box {fields[1:5]} has no area")
            continue
        pts = np.array(values[5:], np.float32).reshape(k, dims)
        if dims == 2:
            pts = np.concatenate([pts, np.full((k, 1), 2.0, np.float32)], 1)
        vis = pts[:, 2]
        if not np.isin(vis, (0.0, 1.0, 2.0)).all():
            problems.append(f"{where}: keypoint visibility must be 0, 1 or 2, got {sorted(set(vis.tolist()))}")
            continue
        labelled = vis > 0
        outside = labelled & ((pts[:, 0] < 0) | (pts[:, 0] > 1) | (pts[:, 1] < 0) | (pts[:, 1] > 1))
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            problems.append(f"{where}: keypoint {i} at ({pts[i, 0]:g}, {pts[i, 1]:g}) is outside the image "
                            f"(normalized coordinates must lie in [0, 1])")
            continue
        pts[~labelled, :2] = 0.0
        cls.append(int(c))
        boxes.append(box)
        kpts.append(pts)
    n = len(cls)
    return (np.array(cls, np.int64), np.array(boxes, np.float32).reshape(n, 4),
            np.array(kpts, np.float32).reshape(n, k, 3), problems)


def _layout(yaml_path: Path, spec: dict) -> tuple[tuple[int, int], tuple[int, ...], tuple, tuple[float, ...]]:
    ks = spec.get("kpt_shape")
    if not (isinstance(ks, (list, tuple)) and len(ks) == 2 and all(isinstance(v, int) for v in ks)
            and ks[0] >= 1 and ks[1] in (2, 3)):
        raise ValueError(f"{yaml_path}: a pose dataset needs 'kpt_shape: [keypoints, 2 or 3]', got {ks!r}")
    k = int(ks[0])
    flip = spec.get("flip_idx", COCO_FLIP_IDX if k == 17 else list(range(k)))
    if not (isinstance(flip, (list, tuple)) and sorted(int(i) for i in flip) == list(range(k))):
        raise ValueError(f"{yaml_path}: 'flip_idx' must be a permutation of 0..{k - 1}, got {flip!r}")
    sk = spec.get("skeleton", default_skeleton(k))
    if not all(isinstance(p, (list, tuple)) and len(p) == 2 and all(0 <= int(i) < k for i in p) for p in sk):
        raise ValueError(f"{yaml_path}: 'skeleton' must be pairs of keypoint indices in 0..{k - 1}, got {sk!r}")
    sig = spec.get("kpt_sigmas", COCO_SIGMAS if k == 17 else [0.05] * k)
    if not (isinstance(sig, (list, tuple)) and len(sig) == k and all(float(s) > 0 for s in sig)):
        raise ValueError(f"{yaml_path}: 'kpt_sigmas' must be {k} positive numbers, got {sig!r}")
    return ((k, int(ks[1])), tuple(int(i) for i in flip), tuple(tuple(int(i) for i in p) for p in sk),
            tuple(float(s) for s in sig))


def resolve_pose_data(data: Any) -> PoseDataConfig:
    """``"shapes-pose"`` (generated on first use) or a YOLO-pose dataset YAML -> the config."""
    check_data_given(data, BUILTIN_POSE)
    if isinstance(data, str) and data == "shapes-pose":
        from .synthetic import make_shapes_pose_dataset
        cfg = resolve_pose_data(make_shapes_pose_dataset())
        cfg.source = "shapes-pose"
        return cfg
    yaml_path = Path(os.fspath(data))
    if yaml_path.is_dir():
        yaml_path = yaml_path / "data.yaml"
    if not yaml_path.is_file():
        raise FileNotFoundError(f"pose dataset not found: '{data}' (expected 'shapes-pose' or a dataset YAML "
                                "with kpt_shape)")
    spec = read_yaml(yaml_path, "path/train/val/names/kpt_shape")
    nc, names = names_from_spec(yaml_path, spec)
    if nc is None:
        raise ValueError(f"{yaml_path}: give 'names' (a list or {{id: name}}) or 'nc'")
    kpt_shape, flip, skeleton, sigmas = _layout(yaml_path, spec)
    root = Path(spec.get("path") or ".")
    root = root if root.is_absolute() else (yaml_path.parent / root)
    root = Path(os.path.normpath(root))
    problems = DataProblems(root, yaml_path)
    splits: dict[str, list[PoseSample]] = {}
    for split in ("train", "val"):
        if split not in spec:
            raise ValueError(f"{yaml_path}: '{split}' is missing")
        images, found = list_split_images(yaml_path, split, spec[split], root, problems)
        problems.extend(found)
        if not images:
            problems.extend([f"{split}: no images found in {spec[split]!r}"])
        samples = []
        for img in images:
            lab = label_path_for(img)
            cls, boxes, kpts, bad = parse_pose_labels(lab, nc, kpt_shape, problems.rel(lab))
            problems.extend(bad)
            with Image.open(img) as im:
                w, h = im.size
            samples.append(PoseSample(img, (h, w), cls, boxes, kpts))
        splits[split] = samples
    problems.raise_if_any()
    return PoseDataConfig(root, nc, names or {i: f"class{i}" for i in range(nc)}, kpt_shape, flip, skeleton,
                          sigmas, splits["train"], splits["val"], str(yaml_path))


def flip_keypoints(kpts: np.ndarray, flip_idx: tuple[int, ...]) -> np.ndarray:
    """Normalized (n, K, 3) keypoints of a horizontally flipped image: x -> 1 - x (labelled ones)
    and left/right swapped by ``flip_idx``."""
    out = kpts[:, list(flip_idx)].copy()
    labelled = out[..., 2] > 0
    out[..., 0] = np.where(labelled, 1.0 - out[..., 0], 0.0)
    return out


class PoseDataset(torch.utils.data.Dataset):
    """Samples of one split as ``(image uint8 (3, S, S), cls (n,), boxes (n, 4) cxcywh, keypoints
    (n, K, 3))``, normalized coordinates, stretched to ``imgsz``; when ``augment``: a flip with
    probability ``fliplr``, then a random zoom and shift (:func:`random_affine`, ``scale`` /
    ``translate``; 0 for none)."""

    def __init__(self, samples: list[PoseSample], imgsz: int, flip_idx: tuple[int, ...], augment: bool = False,
                 fliplr: float = 0.5, scale: float = 0.0, translate: float = 0.0):
        self.samples, self.imgsz, self.flip_idx = samples, int(imgsz), tuple(flip_idx)
        self.augment, self.fliplr = augment, float(fliplr)
        self.scale, self.translate = float(scale), float(translate)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        s = self.samples[i]
        with Image.open(s.path) as im:
            img = np.asarray(im.convert("RGB").resize((self.imgsz, self.imgsz), Image.BILINEAR))
        boxes, kpts = s.boxes.copy(), s.kpts.copy()
        # torch's generator: the DataLoader seeds it per worker and per epoch from the run's seed
        if self.augment and float(torch.rand(())) < self.fliplr:
            img = img[:, ::-1]
            boxes[:, 0] = 1.0 - boxes[:, 0]
            kpts = flip_keypoints(kpts, self.flip_idx)
        image = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        item = image, torch.from_numpy(s.cls), torch.from_numpy(boxes), torch.from_numpy(kpts)
        if self.augment and (self.scale > 0 or self.translate > 0):
            item = random_affine(*item, scale=self.scale, translate=self.translate)
        return item


#: an instance is kept after the affine when this share of its box's area stays inside the image
MIN_AREA_KEPT = 0.25
#: grey of the canvas the affine uncovers (the detection recipe's)
FILL = 114


def random_affine(image: torch.Tensor, cls: torch.Tensor, boxes: torch.Tensor, kpts: torch.Tensor, *,
                  scale: float, translate: float):
    """A random zoom (gain uniform in ``1 +- scale``, about the centre) and shift (whole pixels, up
    to ``translate`` of the side) of one sample: ``image`` (3, S, S) uint8, ``boxes`` (n, 4)
    cxcywh and ``kpts`` (n, K, 3) normalized, moved together by torchvision's ``affine`` (the
    parameters drawn from torch's generator: the loader's per-worker seeding makes a run
    repeatable). Boxes are clamped to the image; an instance keeping under :data:`MIN_AREA_KEPT`
    of its box's area inside, or under 2 pixels a side, is dropped; a keypoint that leaves the
    image becomes unlabelled (0, 0, 0)."""
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as TF

    h, w = image.shape[-2:]
    u = torch.rand(3).tolist()
    gain = 1.0 + (2 * u[0] - 1) * scale
    shift = [round((2 * u[1] - 1) * translate * w), round((2 * u[2] - 1) * translate * h)]
    args = dict(angle=0.0, translate=shift, scale=gain, shear=[0.0, 0.0])
    size = torch.tensor([w, h, w, h], dtype=torch.float32)
    px = tv_tensors.BoundingBoxes(boxes.float() * size, format="CXCYWH", canvas_size=(h, w))
    pts = tv_tensors.KeyPoints(kpts[..., :2].reshape(-1, 2).float() * size[:2], canvas_size=(h, w))
    out_img = TF.affine(tv_tensors.Image(image), **args, fill=FILL)
    out_boxes, out_pts = TF.affine(px, **args), TF.affine(pts, **args)
    area = out_boxes[:, 2] * out_boxes[:, 3]
    keep = (area >= MIN_AREA_KEPT * px[:, 2] * px[:, 3] * gain ** 2) & (out_boxes[:, 2:] >= 2).all(1)
    xy = out_pts.as_subclass(torch.Tensor).reshape(kpts.shape[0], kpts.shape[1], 2)
    inside = (xy[..., 0] >= 0) & (xy[..., 0] < w) & (xy[..., 1] >= 0) & (xy[..., 1] < h) & (kpts[..., 2] > 0)
    new_kpts = torch.cat((xy / size[:2], kpts[..., 2:]), -1).to(kpts.dtype) * inside[..., None]
    new_boxes = (out_boxes.as_subclass(torch.Tensor) / size).to(boxes.dtype)
    return out_img.as_subclass(torch.Tensor), cls[keep], new_boxes[keep], new_kpts[keep]


def bucket_rows(n: int, bucket: int) -> int:
    """The padded row count for ``n`` instances: ``bucket`` times the next power of two."""
    return bucket * 2 ** max(0, math.ceil(math.log2(max(1, n) / bucket)))


def collate_pose(batch, bucket: int = 16):
    """-> images (B, 3, S, S) uint8, cls (B, M) long, boxes (B, M, 4), keypoints (B, M, K, 3), mask
    (B, M) bool, with M = :func:`bucket_rows` of the batch's largest instance count."""
    images = torch.stack([b[0] for b in batch])
    m = bucket_rows(max(len(b[1]) for b in batch), bucket)
    k = batch[0][3].shape[1] if batch[0][3].ndim == 3 else 0
    bsz = len(batch)
    cls = torch.zeros(bsz, m, dtype=torch.long)
    boxes = torch.zeros(bsz, m, 4)
    kpts = torch.zeros(bsz, m, k, 3)
    mask = torch.zeros(bsz, m, dtype=torch.bool)
    for i, (_, c, bx, kp) in enumerate(batch):
        n = len(c)
        cls[i, :n], boxes[i, :n], kpts[i, :n], mask[i, :n] = c, bx, kp, True
    return images, cls, boxes, kpts, mask
