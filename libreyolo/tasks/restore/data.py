"""Restoration datasets: paired folders of degraded (``lq/``) and clean (``gt/``) images.

Layouts ``data=`` takes::

    root/lq/a.png  root/gt/a.png          # one paired folder: both splits (validation = training set)
    root/train/{lq,gt}/  root/val/{lq,gt}/    # a folder per split
    data.yaml                              # path: root, train: train, val: val (folders holding lq/, gt/)

A super-resolution model (scale 2 or 4) reads ``lq_x2/`` or ``lq_x4/`` when the split has it (the
built-in set holds all three), else ``lq/``. An image pairs with the file of the same stem (any
image suffix) at the same place under the other folder; each ``gt`` image is ``scale`` times its
``lq`` image's size. ``data="shapes-restore"`` is the built-in synthetic set (:mod:`.synthetic`).

Content problems - an ``lq`` image without its ``gt`` file or the other way round, a pair whose
sizes are not ``scale`` apart, an ``lq`` image smaller than the training patch, an unreadable
file - are collected over both splits and raised as ONE ``ValueError`` naming each file
(:func:`check_pairs`), before any epoch.

Samples: a patch of ``imgsz`` x ``imgsz`` ``lq`` pixels and the ``gt`` patch under it
(``imgsz * scale``), cropped at random for training (with random flips and 90-degree turns of
the pair), at the centre for validation; uint8 (3, S, S) each.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ...data import paired
from ...data.datasets import DataProblems, check_data_given, is_image_path, parallel_map
from ...data.sources import decode_image

__all__ = ["BUILTIN", "RestoreData", "RestoreDataset", "RestorePair", "check_pairs", "collate_restore",
           "pairs_for", "resolve_restore_data"]

log = logging.getLogger(__name__)

BUILTIN = "shapes-restore"


@dataclass
class RestorePair:
    """One degraded image and its clean target (None: not found, a problem :func:`check_pairs` reports)."""

    lq: Path | None
    gt: Path | None


@dataclass
class RestoreData:
    """A resolved restoration dataset (what :meth:`RestoreTask.datasets` takes): each split's folder
    holding ``gt/`` and the ``lq`` folders."""

    root: Path
    train: Path
    val: Path
    source: str
    nc: int = 1
    names: dict[int, str] = field(default_factory=lambda: {0: "image"})


# --------------------------------------------------------------------------------------------------
# Resolving ``data=``.

def resolve_restore_data(data: Any) -> RestoreData:
    """``"shapes-restore"``, a dataset YAML, a folder holding ``data.yaml``, ``train/`` + ``val/`` or
    ``lq/`` + ``gt/`` -> :class:`RestoreData`; structural mistakes raise at once, naming the path."""
    if isinstance(data, RestoreData):
        return data
    check_data_given(data, (BUILTIN,))
    if not (isinstance(data, str) and data == BUILTIN):
        path = Path(os.fspath(data)).expanduser()
        if path.is_dir() and not (path / "data.yaml").is_file():
            return _from_folder(path)
    return paired.resolve_data_arg(data, BUILTIN, _make_builtin, _resolve_yaml, "restore dataset")


def _make_builtin() -> Path:
    from .synthetic import make_shapes_restore_dataset
    return make_shapes_restore_dataset()


def _split_dir(where: str, folder: Path, split: str) -> Path:
    if not folder.is_dir():
        raise FileNotFoundError(f"{where}: '{split}' folder not found: {folder}")
    if not (folder / "gt").is_dir() or not any(p.is_dir() and p.name.startswith("lq") for p in folder.iterdir()):
        raise FileNotFoundError(f"{where}: the '{split}' folder {folder} needs a gt/ folder (clean images) and an "
                                "lq/ folder (their degraded versions)")
    return folder


def _from_folder(path: Path) -> RestoreData:
    path = path.absolute()
    if (path / "train").is_dir() or (path / "val").is_dir():
        train = _split_dir(str(path), path / "train", "train")
        val = _split_dir(str(path), path / "val", "val")
        return RestoreData(root=path, train=train, val=val, source=str(path))
    if (path / "gt").is_dir() or (path / "lq").is_dir():
        _split_dir(str(path), path, "train")
        log.warning("%s: one paired folder (no train/ and val/): validation runs on the training images", path)
        return RestoreData(root=path, train=path, val=path, source=str(path))
    raise FileNotFoundError(f"dataset not found: '{path}' holds neither data.yaml, train/ + val/ nor lq/ + gt/ "
                            f"(or use data='{BUILTIN}', the built-in set)")


def _resolve_yaml(yaml_path: Path) -> RestoreData:
    yaml_path, spec = paired.read_spec(yaml_path, "path/train/val")
    root = paired.spec_root(yaml_path, spec)
    train = _split_dir(str(yaml_path), paired.under(root, spec["train"]), "train")
    val = _split_dir(str(yaml_path), paired.under(root, spec["val"]), "val")
    return RestoreData(root=root, train=train, val=val, source=str(yaml_path))


# --------------------------------------------------------------------------------------------------
# Pairing and checking.

def lq_folder(split: Path, scale: int) -> Path:
    """The degraded images of ``split`` for a model of ``scale``: ``lq_x{scale}/`` when present, else ``lq/``."""
    own = split / f"lq_x{scale}"
    return own if scale != 1 and own.is_dir() else split / "lq"


def _by_stem(folder: Path) -> dict[Path, Path]:
    """Relative path without suffix -> the image file, for every image under ``folder``."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).with_suffix(""): p for p in sorted(folder.rglob("*")) if is_image_path(p)}


def pairs_for(split: Path, scale: int) -> list[RestorePair]:
    """Every image of ``split``'s lq folder (:func:`lq_folder`) and gt folder, paired by relative
    path and stem; an image whose partner is missing pairs with None."""
    lq, gt = _by_stem(lq_folder(split, scale)), _by_stem(split / "gt")
    return [RestorePair(lq.get(k), gt.get(k)) for k in sorted(set(lq) | set(gt))]


def _check_pair(p: RestorePair, scale: int, imgsz: int, problems: DataProblems) -> list[str]:
    rel = problems.rel
    if p.gt is None:
        return [f"{rel(p.lq)}: no gt image of the same name (expected one under gt/)"]
    if p.lq is None:
        return [f"{rel(p.gt)}: no lq image of the same name (expected one under lq/"
                + (f" or lq_x{scale}/" if scale != 1 else "") + ")"]
    sizes = []
    for f in (p.lq, p.gt):
        try:
            with Image.open(f) as im:
                sizes.append(im.size)
        except Exception as e:  # UnidentifiedImageError, truncated header, ...
            return [f"{rel(f)}: cannot read image ({type(e).__name__}: {e})"]
    (lw, lh), (gw, gh) = sizes
    if (gw, gh) != (lw * scale, lh * scale):
        want = "the same size" if scale == 1 else f"{scale} times its lq image"
        return [f"{rel(p.gt)} is {gw}x{gh} but its lq image {rel(p.lq)} is {lw}x{lh} (width x height): a model "
                f"of scale {scale} needs the gt image to be {want}"]
    if min(lw, lh) < imgsz:
        return [f"{rel(p.lq)} is {lw}x{lh}, smaller than the {imgsz}x{imgsz} training patch: lower imgsz or "
                "leave the image out"]
    return []


def check_pairs(data: RestoreData, scale: int, imgsz: int) -> dict[str, list[RestorePair]]:
    """Both splits' pairs for a model of ``scale`` at patch size ``imgsz``, checked; raises ONE
    ``ValueError`` listing every problem (see the module docstring)."""
    problems = DataProblems(data.root, Path(data.source))
    out = {}
    for split in ("train", "val"):
        folder = getattr(data, split)
        if split == "val" and folder == data.train:   # one paired folder for both: checked once
            out[split] = out["train"]
            continue
        pairs = pairs_for(folder, scale)
        if not pairs:
            problems.extend([f"'{split}' has no images in {problems.rel(lq_folder(folder, scale))} and "
                             f"{problems.rel(folder / 'gt')}"])
        for found in parallel_map(lambda i: _check_pair(pairs[i], scale, imgsz, problems), len(pairs),
                                  f"check {split} pairs"):
            problems.extend(found)
        out[split] = pairs
    problems.raise_if_any()
    return out


# --------------------------------------------------------------------------------------------------
# Dataset and collate.

class RestoreDataset(torch.utils.data.Dataset):
    """Pairs -> (uint8 lq patch (3, S, S), uint8 gt patch (3, S * scale, S * scale)); see the module
    docstring. ``augment``: a random crop and random flips (left-right ``fliplr``, up-down
    ``flipud``) and 90-degree turn (``rot90``), the same on both images; else the centre crop."""

    def __init__(self, pairs: list[RestorePair], imgsz: int, scale: int, *, augment: bool = False,
                 fliplr: float = 0.5, flipud: float = 0.5, rot90: float = 0.5):
        self.pairs, self.imgsz, self.scale = list(pairs), int(imgsz), int(scale)
        self.augment, self.fliplr, self.flipud, self.rot90 = augment, float(fliplr), float(flipud), float(rot90)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.pairs[index]
        lq, gt = decode_image(p.lq), decode_image(p.gt)
        s, k = self.imgsz, self.scale
        h, w = lq.shape[:2]
        if self.augment:
            y, x = int(torch.randint(0, h - s + 1, ())), int(torch.randint(0, w - s + 1, ()))
        else:
            y, x = (h - s) // 2, (w - s) // 2
        a = torch.from_numpy(np.ascontiguousarray(lq[y:y + s, x:x + s])).permute(2, 0, 1)
        b = torch.from_numpy(np.ascontiguousarray(gt[y * k:(y + s) * k, x * k:(x + s) * k])).permute(2, 0, 1)
        if self.augment:
            if float(torch.rand(())) < self.fliplr:
                a, b = a.flip(-1), b.flip(-1)
            if float(torch.rand(())) < self.flipud:
                a, b = a.flip(-2), b.flip(-2)
            if float(torch.rand(())) < self.rot90:
                a, b = a.rot90(1, (-2, -1)), b.rot90(1, (-2, -1))
        return a.contiguous(), b.contiguous()


def collate_restore(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (uint8 lq (B, 3, S, S), uint8 gt (B, 3, S * scale, S * scale))."""
    lq, gt = zip(*batch)
    return torch.stack(lq), torch.stack(gt)
