"""Panoptic datasets: images + panoptic PNGs, checks, samples and collate.

Two layouts:

* This library's (the built-in ``shapes-panoptic`` set writes it)::

      root/images/train/a.jpg   root/panoptic/train/a.png
      path: root
      train: images/train
      val: images/val
      names: [person, car, sky, road]
      things: [0, 1]               # the countable classes; every other class is stuff
      panoptic: {train: ..., val: ...}   # optional; default: ``images`` -> ``panoptic``, suffix .png

  Each PNG is RGB: red = class + 1 (0 = void, not labelled), green + 256 * blue = the instance of
  a thing (1, 2, ... within the image; 0 for stuff: all pixels of a stuff class are one segment).

* COCO panoptic (``format: coco-panoptic``): ``train`` / ``val`` image folders, ``train_json`` /
  ``val_json`` the ``panoptic_*.json`` files, ``train_masks`` / ``val_masks`` their PNG folders (ids
  ``R + 256 G + 256^2 B``, 0 void); the categories' ``isthing`` flags give the things, and their
  ids are renumbered 0..nc-1 in the json's order (COCO's 133 classes: 80 things, then 53 stuff).

A training sample is the image letterboxed as the model's predict does, each segment's class and
its bitmap on the stride-4 grid (the covered fraction of each cell), a horizontal flip with
probability ``fliplr`` when augmenting; batches pad the segments to a bucketed count. Label
problems (a missing or unreadable PNG, a size other than the image's, a class id >= nc, an
instance on a stuff class) are collected over both splits and raised as one error naming each file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ...data import paired
from ...data.datasets import DataProblems, names_from_spec, parallel_map
from ...data.sources import decode_image

__all__ = ["MASK_STRIDE", "PanopticData", "PanopticDataset", "PanopticSample", "collate_panoptic", "read_segments",
           "resolve_panoptic_data"]

#: stride of the training masks (input pixels per mask cell)
MASK_STRIDE = 4


@dataclass
class PanopticSample:
    """One image and its panoptic PNG; ``segments`` (COCO panoptic: segment id -> class) or None
    (this library's encoding, which holds the classes in the PNG)."""

    image: Path
    label: Path
    segments: dict[int, int] | None = None


@dataclass
class PanopticData:
    root: Path
    nc: int
    names: dict[int, str]
    things: list[int]
    train: list[PanopticSample]
    val: list[PanopticSample]
    source: str


def resolve_panoptic_data(data: Any) -> PanopticData:
    """``"shapes-panoptic"``, a dataset YAML or a folder holding ``data.yaml`` -> :class:`PanopticData`."""
    if isinstance(data, PanopticData):
        return data
    return paired.resolve_data_arg(data, "shapes-panoptic", _make_builtin, _resolve_yaml, "panoptic dataset")


def _make_builtin() -> Path:
    from .synthetic import make_shapes_panoptic_dataset
    return make_shapes_panoptic_dataset()


def _resolve_yaml(yaml_path: Path) -> PanopticData:
    yaml_path, spec = paired.read_spec(yaml_path, "path/train/val/names/things")
    root = paired.spec_root(yaml_path, spec)
    if str(spec.get("format", "")).lower() == "coco-panoptic":
        return _resolve_coco(yaml_path, spec, root)
    nc, names = names_from_spec(yaml_path, spec)
    if nc is None:
        raise ValueError(f"{yaml_path}: give 'names' (a list or {{id: name}}) or 'nc'")
    names = names or {i: f"class{i}" for i in range(nc)}
    things = spec.get("things")
    if not isinstance(things, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < nc
                                               for t in things):
        raise ValueError(f"{yaml_path}: 'things' must list the class ids (0..{nc - 1}) of the countable classes, "
                         f"got {things!r}")
    dirs = paired.label_dirs(yaml_path, spec, "panoptic")
    splits = {}
    for split in ("train", "val"):
        img_dir, images = paired.split_images(yaml_path, root, spec[split], split)
        label_dir = paired.under(root, dirs[split]) if split in dirs else None
        pairs = paired.pair_images(yaml_path, img_dir, images, split, label_dir, "panoptic", "panoptic PNGs",
                                   "<panoptic folder>", lambda base: base.with_suffix(".png"))
        splits[split] = [PanopticSample(p, m) for p, m in pairs]
    return PanopticData(root, nc, names, sorted(set(things)), splits["train"], splits["val"], str(yaml_path))


def _resolve_coco(yaml_path: Path, spec: dict, root: Path) -> PanopticData:
    categories: list[dict] | None = None
    splits = {}
    for split in ("train", "val"):
        for key in (f"{split}_json", f"{split}_masks"):
            if key not in spec:
                raise ValueError(f"{yaml_path}: a coco-panoptic dataset needs '{key}'")
        js = paired.under(root, spec[f"{split}_json"])
        masks = paired.under(root, spec[f"{split}_masks"])
        img_dir = paired.under(root, spec[split])
        try:
            doc = json.loads(js.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{yaml_path}: cannot read '{split}_json' {js}: {e}") from None
        cats = doc.get("categories") or []
        categories = categories or cats
        cat_index = {int(c["id"]): i for i, c in enumerate(categories)}
        files = {int(im["id"]): im["file_name"] for im in doc.get("images", [])}
        samples = []
        for ann in doc.get("annotations", []):
            segs = {int(s["id"]): cat_index[int(s["category_id"])] for s in ann.get("segments_info", [])
                    if not s.get("iscrowd", 0)}
            image = img_dir / files.get(int(ann["image_id"]), Path(ann["file_name"]).with_suffix(".jpg").name)
            samples.append(PanopticSample(image, masks / ann["file_name"], segs))
        if not samples:
            raise ValueError(f"{yaml_path}: '{split}_json' {js} has no annotations")
        splits[split] = samples
    assert categories is not None
    names = {i: str(c.get("name", i)) for i, c in enumerate(categories)}
    things = [i for i, c in enumerate(categories) if c.get("isthing")]
    return PanopticData(root, len(categories), names, things, splits["train"], splits["val"], str(yaml_path))


# --------------------------------------------------------------------------------------------------
def read_segments(sample: PanopticSample, nc: int, things: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """A sample's PNG -> (H, W) int64 segment index map (-1 void) and (n,) class of each segment."""
    with Image.open(sample.label) as im:
        if im.mode != "RGB":
            raise ValueError(f"{sample.label}: a panoptic PNG must be RGB, got PIL mode {im.mode}")
        rgb = np.asarray(im).astype(np.int64)
    if sample.segments is not None:   # COCO: ids R + 256 G + 256^2 B, classes from the json
        ids = rgb[..., 0] + 256 * rgb[..., 1] + 65536 * rgb[..., 2]
        keys = np.array(sorted(sample.segments), dtype=np.int64)
        index = np.full(ids.shape, -1, np.int64)
        if keys.size:
            pos = np.searchsorted(keys, ids).clip(max=keys.size - 1)
            hit = keys[pos] == ids
            index[hit] = pos[hit]
        return index, np.array([sample.segments[int(k)] for k in keys], dtype=np.int64)
    cls = rgb[..., 0] - 1
    inst = rgb[..., 1] + 256 * rgb[..., 2]
    bad = cls >= nc
    if bad.any():
        raise ValueError(f"{sample.label}: class ids {sorted(set((cls[bad]).tolist()))[:8]} are not below nc={nc}")
    stuff_inst = (cls >= 0) & (inst > 0) & ~np.isin(cls, list(things))
    if stuff_inst.any():
        raise ValueError(f"{sample.label}: stuff classes {sorted(set(cls[stuff_inst].tolist()))[:8]} carry instance "
                         "ids (green/blue must be 0 for stuff)")
    key = np.where(cls >= 0, cls * 65536 + inst, -1)
    uniq, index = np.unique(key, return_inverse=True)
    index = index.reshape(key.shape)
    if uniq.size and uniq[0] == -1:
        uniq, index = uniq[1:], index - 1
    return index.astype(np.int64), (uniq // 65536).astype(np.int64)


def _check(sample: PanopticSample, nc: int, things: set[int], problems: DataProblems) -> list[str]:
    rel = problems.rel
    if not sample.label.is_file():
        return [f"{rel(sample.image)}: panoptic PNG not found (expected {rel(sample.label)})"]
    try:
        with Image.open(sample.image) as im:
            w, h = im.size
        index, _ = read_segments(sample, nc, things)
    except Exception as e:   # unreadable image or PNG, bad ids
        return [f"{rel(sample.label)}: {type(e).__name__}: {e}"]
    if index.shape != (h, w):
        return [f"{rel(sample.label)}: panoptic PNG is {index.shape[1]}x{index.shape[0]} but its image is {w}x{h}"]
    return []


def check_samples(data: PanopticData) -> None:
    """Every label of both splits checked; one ``ValueError`` lists the problems by file."""
    problems = DataProblems(data.root, Path(data.source))
    things = set(data.things)
    for split in ("train", "val"):
        samples = getattr(data, split)
        for found in parallel_map(lambda i: _check(samples[i], data.nc, things, problems), len(samples),
                                  f"check {split} panoptic labels"):
            problems.extend(found)
    problems.raise_if_any()


class PanopticDataset(torch.utils.data.Dataset):
    """Samples ``(image uint8 (3, S, S), classes int64 (n,), masks float32 (n, S/4, S/4))``: the
    image resized as the model's predict does (``preprocess``, its
    :class:`~libreyolo.ops.preprocess.Preprocess`), the segment map by nearest neighbour onto the
    same canvas, each segment's covered fraction of every stride-4 cell; a horizontal flip with
    probability ``fliplr`` when ``augment``."""

    def __init__(self, samples: list[PanopticSample], imgsz: int, nc: int, things: list[int], preprocess,
                 augment: bool = False, fliplr: float = 0.5):
        from ..semantic.maps import check_resize
        check_resize(preprocess.resize)
        if imgsz % MASK_STRIDE:
            raise ValueError(f"panoptic training needs an imgsz divisible by {MASK_STRIDE}, got {imgsz}")
        self.samples, self.imgsz, self.nc, self.things = list(samples), int(imgsz), int(nc), set(things)
        self.preprocess, self.augment, self.fliplr = preprocess, augment, float(fliplr)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        from ..semantic.maps import letterbox_mask
        s = self.samples[i]
        image = torch.from_numpy(decode_image(s.image))
        index, cls = read_segments(s, self.nc, self.things)
        x = self.preprocess.resize_images(image[None], self.imgsz)[0]
        canvas = letterbox_mask(torch.from_numpy(index), self.imgsz, self.preprocess.resize)      # (S, S), -1 void
        n = int(cls.shape[0])
        onehot = (canvas[None] == torch.arange(n)[:, None, None]).float()
        masks = F.avg_pool2d(onehot[None], MASK_STRIDE)[0]
        if self.augment and torch.rand(()) < self.fliplr:
            x, masks = x.flip(-1), masks.flip(-1)
        img = x.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)
        return img, torch.from_numpy(cls), masks


def collate_panoptic(batch, bucket: int = 16):
    """-> (images uint8 (B, 3, S, S), classes int64 (B, M), row mask bool (B, M), masks float32
    (B, M, S/4, S/4)): M the bucketed segment count (padding rows zero, mask False)."""
    from ...data.augment import max_targets_bucket
    images = torch.stack([b[0] for b in batch])
    counts = [int(b[1].shape[0]) for b in batch]
    m = max_targets_bucket(counts, bucket)
    hw = batch[0][2].shape[-2:]
    cls = torch.zeros((len(batch), m), dtype=torch.long)
    valid = torch.zeros((len(batch), m), dtype=torch.bool)
    masks = torch.zeros((len(batch), m, *hw), dtype=torch.float32)
    for i, (_, c, bm) in enumerate(batch):
        n = counts[i]
        cls[i, :n], valid[i, :n], masks[i, :n] = c, True, bm
    return images, cls, valid, masks
