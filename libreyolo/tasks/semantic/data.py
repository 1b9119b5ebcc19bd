"""Semantic-segmentation datasets: images + PNG label masks, checks, joint augmentation, collate.

Layout and YAML::

    root/images/train/a.jpg   root/masks/train/a.png    # same stem, single-channel class ids
    root/images/val/b.png     root/masks/val/b.png

    path: root                # relative paths are relative to the YAML's folder
    train: images/train       # image folders (searched recursively)
    val: images/val
    names: [background, road, car]   # or {0: background, ...}; nc may replace or accompany it
    ignore_index: 255         # mask value that is not a class (default 255; 65535 above 255 classes)
    masks: {train: masks/train, val: masks/val}   # optional; default: the image path with its
                              # last ``images`` folder replaced by ``masks``, suffix .png

A mask is an 8-bit grey or palette PNG (palette indices are the class ids, as in Pascal VOC) or a
16-bit grey PNG; it has the size of its (upright) image. ``data="shapes-seg"`` is the built-in
synthetic set (:mod:`.synthetic`).

Content problems - a missing mask, a mask whose size differs from its image, a mask that is not
single-channel or holds values >= nc that are not ``ignore_index``, an unreadable file - are
collected over both splits and raised as ONE ``ValueError`` naming each file
(:func:`check_samples`, run before training or validation starts). A split that passed is
remembered in a small cache file in the dataset root keyed by every file's size and mtime, so an
unchanged dataset is not decoded again.

In memory, ignored pixels carry :data:`IGNORE` (-1) whatever value the files use, so the loss and
the evaluator need not know the dataset's ``ignore_index``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from ...data import paired
from ...data.datasets import DataProblems, exif_orientation, names_from_spec, parallel_map
from ...data.sources import decode_image
from ...ops.letterbox import PAD_VALUE, letterbox, letterbox_params
from .maps import IGNORE, check_resize, letterbox_mask, resize_nearest

__all__ = ["SegSample", "SemanticData", "SemanticDataset", "check_samples", "collate_semantic", "mask_path_for",
           "read_mask", "resolve_semantic_data"]

log = logging.getLogger(__name__)

DEFAULT_IGNORE_INDEX = 255
_CACHE_VERSION = "libreyolo-semantic-v1"
#: PIL modes a mask may have (one channel of class ids)
_MASK_MODES = ("L", "P", "I;16", "I;16L", "I;16B", "I")


@dataclass
class SegSample:
    """One image and its label mask."""

    image: Path
    mask: Path


@dataclass
class SemanticData:
    """A resolved semantic-segmentation dataset (what :meth:`SemanticTask.datasets` takes)."""

    root: Path
    nc: int
    names: dict[int, str]
    train: list[SegSample]
    val: list[SegSample]
    ignore_index: int
    source: str


# --------------------------------------------------------------------------------------------------
# Resolving ``data=``.


def resolve_semantic_data(data: Any) -> SemanticData:
    """``"shapes-seg"``, a dataset YAML or a folder holding ``data.yaml`` -> :class:`SemanticData`.

    Structural mistakes (a missing key or folder, an empty split) raise at once naming the key and
    path; the content of the masks is checked by :func:`check_samples`.
    """
    if isinstance(data, SemanticData):
        return data
    return paired.resolve_data_arg(data, "shapes-seg", _make_builtin, _resolve_yaml, "segmentation dataset")


def _make_builtin() -> Path:
    from .synthetic import make_shapes_seg_dataset
    return make_shapes_seg_dataset()


def mask_path_for(image: Path) -> Path | None:
    """The default mask of ``image``: its last ``images`` folder becomes ``masks``, suffix ``.png``
    (None when the path has no ``images`` folder)."""
    base = paired.mirror_images(image, "masks")
    return None if base is None else _png(base)


def _png(base: Path) -> Path:
    return base.with_suffix(".png")


def _resolve_yaml(yaml_path: Path) -> SemanticData:
    yaml_path, spec = paired.read_spec(yaml_path, "path/train/val/names")
    root = paired.spec_root(yaml_path, spec)
    nc, names = names_from_spec(yaml_path, spec)
    if nc is None:
        raise ValueError(f"{yaml_path}: give 'names' (a list or {{id: name}}) or 'nc'")
    names = names or {i: f"class{i}" for i in range(nc)}
    # 255 unless that is a class id (more than 255 classes: 16-bit masks), then 65535
    ignore = spec.get("ignore_index", DEFAULT_IGNORE_INDEX if nc <= DEFAULT_IGNORE_INDEX else 65535)
    if not isinstance(ignore, int) or isinstance(ignore, bool) or ignore < 0:
        raise ValueError(f"{yaml_path}: 'ignore_index' must be a non-negative integer, got {ignore!r}")
    if ignore < nc:
        raise ValueError(f"{yaml_path}: ignore_index {ignore} is a class id (nc={nc}); use a value >= nc")
    masks = paired.label_dirs(yaml_path, spec, "masks")
    splits = {}
    for split in ("train", "val"):
        entry = spec[split]
        if not isinstance(entry, (str, os.PathLike)):
            raise ValueError(f"{yaml_path}: '{split}' must be one image folder, got {type(entry).__name__}")
        img_dir, images = paired.split_images(yaml_path, root, entry, split)
        mask_dir = None
        if split in masks:
            mask_dir = paired.under(root, masks[split])
            if not mask_dir.is_dir():
                raise FileNotFoundError(f"{yaml_path}: 'masks.{split}' folder not found: {mask_dir}")
        pairs = paired.pair_images(yaml_path, img_dir, images, split, mask_dir, "masks", "masks", "<mask folder>",
                                   _png)
        splits[split] = [SegSample(p, m) for p, m in pairs]
    log.info("%s: %d train and %d val images, %d classes, ignore_index %d", yaml_path,
             len(splits["train"]), len(splits["val"]), nc, ignore)
    return SemanticData(root=root, nc=nc, names=names, train=splits["train"], val=splits["val"],
                        ignore_index=ignore, source=str(yaml_path))


# --------------------------------------------------------------------------------------------------
# Content checks.


def _mode_problem(mode: str) -> str | None:
    if mode in _MASK_MODES:
        return None
    return (f"mask is not single-channel (PIL mode {mode}): save the class ids as an 8-bit grey or palette "
            "PNG, or a 16-bit grey PNG")


def read_mask(path: Path) -> np.ndarray:
    """A mask file -> (H, W) integer array of its values (uint8, or int32 for 16-bit PNGs)."""
    with Image.open(path) as im:
        problem = _mode_problem(im.mode)
        if problem:
            raise ValueError(f"{path}: {problem}")
        arr = np.asarray(im)
    return arr if arr.dtype == np.uint8 else arr.astype(np.int32)


def _image_size(path: Path) -> tuple[int, int]:
    """(height, width) of the image as decoded (upright: EXIF orientation applied), from its header."""
    with Image.open(path) as im:
        w, h = im.size
        orientation = exif_orientation(im.info.get("exif"))
    return (w, h) if orientation in (5, 6, 7, 8) else (h, w)


def _check_pair(s: SegSample, nc: int, ignore: int, problems: DataProblems) -> list[str]:
    rel = problems.rel
    if not s.mask.is_file():
        return [f"{rel(s.image)}: mask not found (expected {rel(s.mask)})"]
    try:
        hw = _image_size(s.image)
    except Exception as e:  # UnidentifiedImageError, truncated header, ...
        return [f"{rel(s.image)}: cannot read image ({type(e).__name__}: {e})"]
    try:
        with Image.open(s.mask) as im:
            problem = _mode_problem(im.mode)
            if problem:
                return [f"{rel(s.mask)}: {problem}"]
        arr = read_mask(s.mask)
    except Exception as e:  # not an image, truncated data, ...
        return [f"{rel(s.mask)}: cannot decode mask ({type(e).__name__}: {e})"]
    found = []
    if arr.shape != hw:
        found.append(f"{rel(s.mask)}: mask is {arr.shape[1]}x{arr.shape[0]} but its image {rel(s.image)} is "
                     f"{hw[1]}x{hw[0]} (width x height)")
    if arr.dtype == np.uint8:
        present = np.flatnonzero(np.bincount(arr.reshape(-1), minlength=256))
    else:
        present = np.unique(arr)
    bad = [int(v) for v in present if v >= nc and v != ignore]
    if bad:
        shown = ", ".join(str(v) for v in bad[:8]) + (", ..." if len(bad) > 8 else "")
        found.append(f"{rel(s.mask)}: values {shown} are not class ids (nc={nc}) nor ignore_index ({ignore})")
    return found


def _stat(p: Path) -> list:
    try:
        st = p.stat()
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return [None, None]


def check_samples(data: SemanticData, ignore_index: int | None = None) -> None:
    """Check every image/mask pair of both splits (see the module docstring); raises ONE
    ``ValueError`` listing the problems, each naming its file."""
    ignore = data.ignore_index if ignore_index is None else int(ignore_index)
    if ignore < data.nc:
        raise ValueError(f"ignore_index {ignore} is a class id of this {data.nc}-class dataset; use a value >= nc")
    problems = DataProblems(data.root, Path(data.source))
    passed = {}
    for split in ("train", "val"):
        samples = getattr(data, split)
        key = hashlib.sha256(json.dumps(
            [_CACHE_VERSION, data.nc, ignore,
             [[str(s.image), *_stat(s.image), str(s.mask), *_stat(s.mask)] for s in samples]]).encode()).hexdigest()
        cache = data.root / f".libreyolo-semantic-{split}.cache"
        try:
            if cache.read_text().strip() == key:
                continue
        except OSError:
            pass
        found = parallel_map(lambda i: _check_pair(samples[i], data.nc, ignore, problems), len(samples),
                          f"check {split} masks")
        before = len(problems.items)
        for f in found:
            problems.extend(f)
        if len(problems.items) == before:
            passed[cache] = key
    problems.raise_if_any()
    for cache, key in passed.items():
        _write_atomic(cache, key)


def _write_atomic(path: Path, text: str) -> None:
    """Best effort: a read-only dataset folder just means the checks run again next time."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("could not write %s: %s", path, e)


# --------------------------------------------------------------------------------------------------
# Dataset and collate.


class _RandomScale(v2.Transform):
    """Image and mask resized together to a random fraction of the network's square, placed as
    predict's resize places them (stretched, or scaled to fit): side ``round(size * s)`` with s
    uniform in ``scale``. Bilinear without antialiasing for the image (as predict's resize), the
    pixel-centre nearest neighbour for the mask."""

    def __init__(self, size: int, scale: tuple[float, float], mode: str):
        super().__init__()
        self.size, self.scale, self.mode = int(size), (float(scale[0]), float(scale[1])), mode

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        s = float(torch.empty(()).uniform_(*self.scale))
        return {"side": max(1, round(self.size * s))}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        h, w = int(inpt.shape[-2]), int(inpt.shape[-1])
        p = letterbox_params(h, w, params["side"], self.mode)
        if isinstance(inpt, tv_tensors.Mask):
            return tv_tensors.wrap(resize_nearest(inpt.as_subclass(torch.Tensor), p.new_h, p.new_w), like=inpt)
        return TF.resize(inpt, [p.new_h, p.new_w], interpolation=v2.InterpolationMode.BILINEAR, antialias=False)


class SemanticDataset(torch.utils.data.Dataset):
    """Pairs -> (uint8 image (3, S, S), int64 mask (S, S) with :data:`IGNORE` for ignored pixels).

    ``augment=False`` resizes as predict does (``resize`` mode; masks by nearest neighbour);
    ``augment=True`` applies the joint torchvision.transforms.v2 pipeline: random scale in
    ``scale`` (of the network's square), random crop to S x S (padded with grey 114 / IGNORE where
    the scaled image is smaller), horizontal flip with probability ``fliplr`` and colour jitter
    of strength ``color_jitter`` on the image only (brightness, contrast and saturation factors in
    [1 - s, 1 + s], hue shift up to s / 4).
    """

    def __init__(self, samples: list[SegSample], imgsz: int, ignore_index: int, resize: str = "stretch", *,
                 augment: bool = False, scale: tuple[float, float] = (0.5, 2.0), fliplr: float = 0.5,
                 color_jitter: float = 0.3):
        check_resize(resize)
        self.samples, self.imgsz, self.ignore_index, self.resize = list(samples), int(imgsz), int(ignore_index), resize
        self.augment = augment
        steps: list[v2.Transform] = [
            _RandomScale(self.imgsz, scale, resize),
            v2.RandomCrop(self.imgsz, pad_if_needed=True, fill={tv_tensors.Image: PAD_VALUE, tv_tensors.Mask: IGNORE}),
        ]
        if fliplr > 0:
            steps.append(v2.RandomHorizontalFlip(fliplr))
        if color_jitter > 0:
            s = float(color_jitter)
            steps.append(v2.ColorJitter(brightness=s, contrast=s, saturation=s, hue=min(0.5, s / 4)))
        self.transforms = v2.Compose(steps)

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``index`` as decoded: (H, W, 3) uint8 RGB upright, (H, W) int64 mask (IGNORE)."""
        s = self.samples[index]
        image = torch.from_numpy(decode_image(s.image))
        mask = torch.from_numpy(read_mask(s.mask).astype(np.int64))
        mask[mask == self.ignore_index] = IGNORE
        return image, mask

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = self.load(index)
        if not self.augment:
            x = letterbox(image.unsqueeze(0), self.imgsz, self.resize)[0]   # predict's own resize
            x = x.mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)        # back to the uint8 grid
            return x, letterbox_mask(mask, self.imgsz, self.resize)
        img, m = self.transforms(tv_tensors.Image(image.permute(2, 0, 1).contiguous()), tv_tensors.Mask(mask))
        return img.as_subclass(torch.Tensor).contiguous(), m.as_subclass(torch.Tensor).contiguous()


def collate_semantic(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (uint8 images (B, 3, S, S), int64 masks (B, S, S)): fixed shapes for a fixed imgsz."""
    images, masks = zip(*batch)
    return torch.stack(images), torch.stack(masks)
