"""Image / caption data of the embed task: the built-in ``shapes-captions`` set, classification
folders read as captions, the dataset and the collate.

``shapes-captions`` (generated in memory, deterministic: image ``i`` of a split is drawn by its own
seeded generator): one filled shape - circle, square or triangle - in red, green, blue or yellow
on a grey background, big or small, anywhere in the picture. Its 12 classes are colour + shape,
zero-shot prompts ``"a red circle"``, ...; each image's caption adds its size (``"a small red
circle"``), so the 24 captions are finer than the classes (retrieval). Classes take turns, both
splits are balanced.

A classification dataset (an ImageFolder root, its YAML, or ``shapes-cls``:
:mod:`libreyolo.data.imagefolder`) serves too: each image's caption is its class name in
``"a photo of a {}."``, which is also the class prompt.

Items are ``(uint8 (3, S, S), caption index)``: images resized as predict resizes them
(``model.preprocess``), the caption's token ids looked up by the collate from the split's
pre-tokenized captions, so the batch is ``(images uint8 (B, 3, S, S), token ids (B, L) int64,
caption ids (B,) int64, class ids (B,) int64)``: fixed shapes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

BUILTIN = "shapes-captions"
COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40)}
SHAPES = ("circle", "square", "triangle")
SIZES = ("small", "big")
#: the class-name template of a classification dataset read as captions
CAPTION_TEMPLATE = "a photo of a {}."


@dataclass
class Sample:
    """One image: where it comes from (a file, or ``(split seed, index)`` of the built-in set),
    its caption and its class."""

    image: Any
    caption: str
    cls: int


@dataclass
class EmbedData:
    """A resolved image / caption dataset: the class prompts (zero-shot classes) and the samples."""

    source: str
    prompts: list[str]
    train: list[Sample] = field(default_factory=list)
    val: list[Sample] = field(default_factory=list)
    #: built-in set: the side its images are drawn at
    side: int = 96

    @property
    def nc(self) -> int:
        return len(self.prompts)

    @property
    def names(self) -> dict[int, str]:
        return dict(enumerate(self.prompts))


def builtin_classes() -> list[tuple[str, str]]:
    return [(c, s) for c in COLORS for s in SHAPES]


def describe(seed: int, index: int) -> tuple[np.random.Generator, str, int, str, str, str]:
    """Image ``index`` of the split drawn from ``seed``: its generator (after the size draw),
    caption, class, colour, shape and size, without drawing it."""
    classes = builtin_classes()
    cls = index % len(classes)
    color, shape = classes[cls]
    rng = np.random.default_rng([seed, index])
    size = SIZES[int(rng.integers(2))]
    return rng, f"a {size} {color} {shape}", cls, color, shape, size


def render_shape(seed: int, index: int, side: int = 96) -> tuple[np.ndarray, str, int]:
    """Image ``index`` of the split drawn from ``seed``: ((side, side, 3) uint8, caption, class)."""
    rng, caption, cls, color, shape, size = describe(seed, index)
    grey = int(rng.integers(90, 170))
    noise = rng.integers(-12, 13, (side, side, 3))
    bg = np.clip(grey + noise, 0, 255).astype(np.uint8)
    im = Image.fromarray(bg)
    r = side * (rng.uniform(0.12, 0.18) if size == "small" else rng.uniform(0.3, 0.42))
    cx, cy = rng.uniform(r + 1, side - r - 1, 2)
    fill = tuple(int(np.clip(v + rng.integers(-20, 21), 0, 255)) for v in COLORS[color])
    d = ImageDraw.Draw(im)
    if shape == "circle":
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        d.rectangle((cx - r * 0.9, cy - r * 0.9, cx + r * 0.9, cy + r * 0.9), fill=fill)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r * 0.8), (cx + r, cy + r * 0.8)], fill=fill)
    return np.asarray(im), caption, cls


def make_builtin(n_train: int = 384, n_val: int = 96, side: int = 96, seed: int = 0) -> EmbedData:
    """The ``shapes-captions`` set (see the module docstring)."""
    prompts = [f"a {c} {s}" for c, s in builtin_classes()]

    def split(split_seed: int, n: int) -> list[Sample]:
        out = []
        for i in range(n):
            _, caption, cls, *_ = describe(split_seed, i)
            out.append(Sample((split_seed, i), caption, cls))
        return out
    return EmbedData(BUILTIN, prompts, split(2 * seed + 1, n_train), split(2 * seed + 2, n_val), side)


def resolve_embed_data(data: Any) -> EmbedData:
    """``data`` -> :class:`EmbedData`: ``"shapes-captions"`` (or an :class:`EmbedData` as it is), or
    a classification dataset read as captions (see the module docstring)."""
    if isinstance(data, EmbedData):
        return data
    if data is None:
        raise ValueError(f"the embed task needs data=: '{BUILTIN}' (built in) or a classification dataset "
                         "(an ImageFolder root or its YAML), whose class names become captions")
    if str(data) == BUILTIN:
        return make_builtin()
    from ...data.imagefolder import resolve_classify_data
    try:
        cd = resolve_classify_data(data)
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"embed data {data!r}: neither '{BUILTIN}' nor a classification dataset ({exc})") from None
    prompts = [CAPTION_TEMPLATE.format(cd.names[i]) for i in range(cd.nc)]
    return EmbedData(str(data), prompts, [Sample(p, prompts[c], c) for p, c in cd.train],
                     [Sample(p, prompts[c], c) for p, c in cd.val])


class EmbedDataset(Dataset):
    """Samples -> ``(uint8 (3, S, S) as predict resizes, caption index, class)``; ``caption_index``:
    caption -> its row in the collate's token-id table (both splits share one table)."""

    def __init__(self, samples: Sequence[Sample], imgsz: int, preprocess, caption_index: dict[str, int],
                 side: int = 96):
        self.samples = list(samples)
        self.imgsz, self.preprocess, self.side = int(imgsz), preprocess, int(side)
        self.caption_index = caption_index

    def __len__(self) -> int:
        return len(self.samples)

    def _pixels(self, s: Sample) -> np.ndarray:
        if isinstance(s.image, tuple):
            return render_shape(s.image[0], s.image[1], self.side)[0]
        from ...data.sources import decode_image
        return decode_image(Path(s.image))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        s = self.samples[index]
        hwc = torch.from_numpy(np.array(self._pixels(s), dtype=np.uint8))   # a writable copy
        x = self.preprocess.resize_images(hwc.unsqueeze(0), self.imgsz)[0]
        return x.mul(255).round_().clamp_(0, 255).to(torch.uint8), self.caption_index[s.caption], s.cls


class EmbedCollate:
    """Items -> ``(images uint8, token ids (B, L), caption ids (B,), class ids (B,))``; ``ids``: the
    token ids of every caption of both splits, one row each (one bucketed length)."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __call__(self, items) -> tuple[torch.Tensor, ...]:
        images = torch.stack([it[0] for it in items])
        caps = torch.tensor([it[1] for it in items], dtype=torch.long)
        cls = torch.tensor([it[2] for it in items], dtype=torch.long)
        return images, self.ids[caps], caps, cls
