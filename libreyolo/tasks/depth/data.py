"""Depth datasets: images + per-pixel depth maps, checks, resize / flip / colour jitter, collate.

Layout and YAML::

    root/images/train/a.jpg   root/depth/train/a.npy    # same stem: float (H, W) .npy, or a
    root/images/val/b.png     root/depth/val/b.png      # 16-bit grey PNG (values / png_scale)

    path: root              # relative paths are relative to the YAML's folder
    train: images/train     # image folders (searched recursively)
    val: images/val
    target: depth           # what the files hold: "depth" (the default; trained as its inverse)
                            # or "disparity" (inverse depth, as Depth Anything predicts it)
    png_scale: 1000         # 16-bit PNGs: stored value / png_scale = the target (default 1000: mm)
    depth: {train: depth/train, val: depth/val}   # optional; default: the image path with its
                            # last ``images`` folder replaced by ``depth``, suffix .npy, else .png

Pixels whose value is 0 or not finite carry no target (a sensor hole): they are left out of the
loss and the metrics. ``data="shapes-depth"`` is the built-in synthetic set (:mod:`.synthetic`).
Content problems - a missing map, a map whose size differs from its image, a map that is not one
channel, one with no valid pixel, an unreadable file - are collected over both splits and raised
as ONE ``ValueError`` naming each file (:func:`check_samples`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

from ...data import paired
from ...data.datasets import DataProblems, parallel_map
from ...data.sources import decode_image
from ...ops.letterbox import letterbox
from ..semantic.maps import resize_nearest

__all__ = ["DepthData", "DepthDataset", "DepthSample", "check_samples", "collate_depth", "read_target",
           "resolve_depth_data"]

log = logging.getLogger(__name__)

TARGETS = ("depth", "disparity")
DEFAULT_PNG_SCALE = 1000.0
_MAP_SUFFIXES = (".npy", ".png")


@dataclass
class DepthSample:
    """One image and its depth (or disparity) map."""

    image: Path
    target: Path


@dataclass
class DepthData:
    """A resolved depth dataset (what :meth:`DepthTask.datasets` takes)."""

    root: Path
    train: list[DepthSample]
    val: list[DepthSample]
    source: str
    target: str = "depth"
    png_scale: float = DEFAULT_PNG_SCALE
    nc: int = 1
    names: dict[int, str] = field(default_factory=lambda: {0: "depth"})


# --------------------------------------------------------------------------------------------------
# Resolving ``data=``.

def resolve_depth_data(data: Any) -> DepthData:
    """``"shapes-depth"``, a dataset YAML or a folder holding ``data.yaml`` -> :class:`DepthData`.

    Structural mistakes (a missing key or folder, an empty split, an unknown ``target``) raise at
    once naming the key and path; the maps themselves are checked by :func:`check_samples`.
    """
    if isinstance(data, DepthData):
        return data
    return paired.resolve_data_arg(data, "shapes-depth", _make_builtin, _resolve_yaml, "depth dataset")


def _make_builtin() -> Path:
    from .synthetic import make_shapes_depth_dataset
    return make_shapes_depth_dataset()


def target_path_for(image: Path) -> Path | None:
    """The default map of ``image``: its last ``images`` folder becomes ``depth``, suffix ``.npy``
    if that file exists, else ``.png`` (None when the path has no ``images`` folder)."""
    base = paired.mirror_images(image, "depth")
    return None if base is None else _npy_or_png(base)


def _npy_or_png(base: Path) -> Path:
    npy = base.with_suffix(".npy")
    return npy if npy.is_file() else base.with_suffix(".png")


def _resolve_yaml(yaml_path: Path) -> DepthData:
    yaml_path, spec = paired.read_spec(yaml_path, "path/train/val")
    target = spec.get("target", "depth")
    if target not in TARGETS:
        raise ValueError(f"{yaml_path}: 'target' must be one of {', '.join(TARGETS)}, got {target!r}")
    scale = spec.get("png_scale", DEFAULT_PNG_SCALE)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"{yaml_path}: 'png_scale' must be a number > 0, got {scale!r}")
    root = paired.spec_root(yaml_path, spec)
    dirs = paired.label_dirs(yaml_path, spec, "depth")
    splits = {}
    for split in ("train", "val"):
        img_dir, images = paired.split_images(yaml_path, root, spec[split], split)
        map_dir = paired.under(root, dirs[split]) if split in dirs else None
        pairs = paired.pair_images(yaml_path, img_dir, images, split, map_dir, "depth", "depth maps", "<folder>",
                                   _npy_or_png)
        splits[split] = [DepthSample(p, t) for p, t in pairs]
    log.info("%s: %d train and %d val images, target %s", yaml_path, len(splits["train"]),
             len(splits["val"]), target)
    return DepthData(root=root, train=splits["train"], val=splits["val"], source=str(yaml_path), target=target,
                     png_scale=float(scale))


# --------------------------------------------------------------------------------------------------
# Reading and checking.

def read_target(path: Path, target: str = "depth", png_scale: float = DEFAULT_PNG_SCALE) -> tuple[np.ndarray, np.ndarray]:
    """A map file -> ((H, W) float32 disparity, (H, W) bool valid). Depth is inverted (1 / d);
    zeros and non-finite values are invalid (their disparity is 0)."""
    if path.suffix.lower() == ".npy":
        arr = np.load(path, allow_pickle=False)
        if arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        if arr.ndim != 2 or arr.dtype.kind not in "fiu":
            raise ValueError(f"{path}: a depth map must be an (H, W) numeric array, got shape {arr.shape} "
                             f"dtype {arr.dtype}")
        arr = arr.astype(np.float32)
    else:
        with Image.open(path) as im:
            if im.mode not in ("I;16", "I;16L", "I;16B", "I", "F", "L"):
                raise ValueError(f"{path}: a depth PNG must be one channel (16-bit grey), got PIL mode {im.mode}")
            arr = np.asarray(im).astype(np.float32) / np.float32(png_scale)
    valid = np.isfinite(arr) & (arr > 0)
    value = np.where(valid, arr, np.float32(1))
    if target == "depth":
        value = np.float32(1) / value
    return np.where(valid, value, np.float32(0)).astype(np.float32), valid


def _check_pair(s: DepthSample, data: DepthData, problems: DataProblems) -> list[str]:
    rel = problems.rel
    if not s.target.is_file():
        return [f"{rel(s.image)}: depth map not found (expected {rel(s.target)}, or the same stem with "
                f"{' / '.join(_MAP_SUFFIXES)})"]
    try:
        with Image.open(s.image) as im:
            w, h = im.size
    except Exception as e:  # UnidentifiedImageError, truncated header, ...
        return [f"{rel(s.image)}: cannot read image ({type(e).__name__}: {e})"]
    try:
        disp, valid = read_target(s.target, data.target, data.png_scale)
    except Exception as e:
        return [f"{rel(s.target)}: cannot read depth map ({type(e).__name__}: {e})"]
    found = []
    if disp.shape != (h, w):
        found.append(f"{rel(s.target)}: map is {disp.shape[1]}x{disp.shape[0]} but its image {rel(s.image)} is "
                     f"{w}x{h} (width x height)")
    if not valid.any():
        found.append(f"{rel(s.target)}: no valid pixel (every value is 0 or not finite)")
    return found


def check_samples(data: DepthData) -> None:
    """Check every image/map pair of both splits; raises ONE ``ValueError`` listing the problems."""
    problems = DataProblems(data.root, Path(data.source))
    for split in ("train", "val"):
        samples = getattr(data, split)
        for f in parallel_map(lambda i: _check_pair(samples[i], data, problems), len(samples), f"check {split} maps"):
            problems.extend(f)
    problems.raise_if_any()


# --------------------------------------------------------------------------------------------------
# Dataset and collate.

class DepthDataset(torch.utils.data.Dataset):
    """Pairs -> (uint8 image (3, S, S), float32 disparity (S, S), bool valid (S, S)).

    The image is stretched to S x S as predict does; the map and its valid mask by the
    pixel-centre nearest neighbour (no averaging of depths across an object's edge, nor of
    holes into valid pixels). ``augment=True`` adds a joint horizontal flip (probability
    ``fliplr``) and colour jitter of strength ``color_jitter`` on the image only (brightness,
    contrast, saturation in [1 - s, 1 + s], hue up to s / 4): geometry changes that move depth
    values (scaling, cropping with a different field of view) are left out.
    """

    def __init__(self, samples: list[DepthSample], imgsz: int, target: str = "depth",
                 png_scale: float = DEFAULT_PNG_SCALE, *, augment: bool = False, fliplr: float = 0.5,
                 color_jitter: float = 0.3):
        self.samples, self.imgsz = list(samples), int(imgsz)
        self.target, self.png_scale = target, float(png_scale)
        self.augment, self.fliplr = augment, float(fliplr)
        s = float(color_jitter)
        self.jitter = v2.ColorJitter(brightness=s, contrast=s, saturation=s, hue=min(0.5, s / 4)) if s > 0 else None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.samples[index]
        image = torch.from_numpy(decode_image(s.image))
        disp, valid = read_target(s.target, self.target, self.png_scale)
        x = letterbox(image.unsqueeze(0), self.imgsz, "stretch")[0]     # predict's own resize
        x = x.mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)        # back to the uint8 grid
        d = resize_nearest(torch.from_numpy(disp), self.imgsz, self.imgsz)
        m = resize_nearest(torch.from_numpy(valid), self.imgsz, self.imgsz)
        if self.augment:
            if self.fliplr > 0 and float(torch.rand(())) < self.fliplr:
                x, d, m = x.flip(-1), d.flip(-1), m.flip(-1)
            if self.jitter is not None:
                x = self.jitter(x)
        return x.contiguous(), d.contiguous(), m.contiguous()


def collate_depth(batch: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """-> (uint8 images (B, 3, S, S), float32 disparity (B, S, S), bool valid (B, S, S))."""
    images, disp, valid = zip(*batch)
    return torch.stack(images), torch.stack(disp), torch.stack(valid)
