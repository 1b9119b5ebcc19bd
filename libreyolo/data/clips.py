"""Synthetic video clips of moving shapes, with their ground truth.

The clips exist so that video decoding, tracking and ``libreyolo bench source=clip.mp4`` can be
exercised with no download: :func:`moving_shapes` renders the frames in memory, each with the boxes
of the shapes in it, and :func:`write_moving_shapes_clip` writes them to a video file
(``scripts/make_clip.py`` is its command line; a 1080p clip for the GPU bench is one call).

Each clip shows ``objects`` filled shapes (circle, square, triangle: the first classes of the
built-in ``shapes`` set) of fixed size moving at constant velocity and bouncing off the frame
edges, drawn in id order over a fixed background (a smooth gradient with a little static noise,
so that a camera-motion estimator finds still texture). Shapes may pass over one another; the
boxes are each shape's full extent. Generation is deterministic for a given ``seed``.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np
from PIL import Image, ImageDraw

from .synthetic import SHAPE_NAMES

__all__ = ["CLIP_CLASSES", "moving_shapes", "write_moving_shapes_clip"]

#: The classes the clips draw (ids into :data:`~libreyolo.data.synthetic.SHAPE_NAMES`).
CLIP_CLASSES: tuple[str, ...] = SHAPE_NAMES[:3]


def _background(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    top, bottom = rng.uniform(40, 110, 3), rng.uniform(40, 110, 3)
    left_right = rng.uniform(-30, 30, 3)
    img = top + (bottom - top) * y + left_right * (x - 0.5)
    img = img + rng.normal(0.0, 6.0, (height, width, 1)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def moving_shapes(width: int = 1920, height: int = 1080, frames: int = 300, objects: int = 6, seed: int = 0,
                  speed: float = 0.012) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``frames`` (image, truth) pairs: image HxWx3 uint8 RGB; truth (n, 6) float64 rows
    ``id, class, x1, y1, x2, y2`` (pixels, x2/y2 exclusive) of the ``n = objects`` shapes.

    Shapes are 8% to 16% of the short side; ``speed`` is the mean distance a shape moves per frame
    as a fraction of the short side (0.012: about 13 px per frame at 1080p).
    """
    if width < 32 or height < 32:
        raise ValueError(f"a clip must be at least 32x32 pixels, got {width}x{height}")
    if frames < 1 or objects < 1:
        raise ValueError(f"frames and objects must be >= 1, got {frames} and {objects}")
    rng = np.random.default_rng(seed)
    short = min(width, height)
    bg = _background(width, height, rng)
    sizes = rng.uniform(0.08, 0.16, objects) * short
    pos = np.stack([rng.uniform(0, width - sizes), rng.uniform(0, height - sizes)], axis=1)
    angle = rng.uniform(0, 2 * math.pi, objects)
    v = rng.uniform(0.6, 1.4, objects)[:, None] * speed * short * np.stack([np.cos(angle), np.sin(angle)], axis=1)
    classes = np.arange(objects) % len(CLIP_CLASSES)
    colors = [tuple(int(c) for c in rng.integers(150, 256, 3)) for _ in range(objects)]
    for _ in range(frames):
        im = Image.fromarray(bg.copy())
        draw = ImageDraw.Draw(im)
        truth = np.zeros((objects, 6), np.float64)
        for k in range(objects):
            x1, y1 = pos[k]
            s = sizes[k]
            box = (x1, y1, x1 + s, y1 + s)
            if classes[k] == 0:
                draw.ellipse(box, fill=colors[k])
            elif classes[k] == 1:
                draw.rectangle(box, fill=colors[k])
            else:
                draw.polygon([(x1 + s / 2, y1), (x1 + s, y1 + s), (x1, y1 + s)], fill=colors[k])
            truth[k] = (k, classes[k], *box)
        yield np.asarray(im), truth
        pos += v
        for d, limit in ((0, width), (1, height)):  # bounce off the edges
            low, high = pos[:, d] < 0, pos[:, d] + sizes > limit
            v[low | high, d] *= -1
            pos[low, d] = -pos[low, d]
            pos[high, d] = 2 * (limit - sizes[high]) - pos[high, d]


def write_moving_shapes_clip(path: str | os.PathLike, width: int = 1920, height: int = 1080, frames: int = 300,
                             fps: float = 30.0, objects: int = 6, seed: int = 0) -> list[np.ndarray]:
    """Write a :func:`moving_shapes` clip to ``path`` (an ``.mp4``, through
    :class:`~libreyolo.data.video.VideoWriter`) and return its truth, one array per frame."""
    from .video import VideoWriter

    writer = VideoWriter(path, fps, width, height)
    truth = []
    try:
        for image, t in moving_shapes(width, height, frames, objects, seed):
            writer.write(image)
            truth.append(t)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return truth
