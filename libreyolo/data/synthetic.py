"""The built-in ``shapes`` dataset: small synthetic images of five shape classes, YOLO format.

It exists so that training, validation and the CUDA-graph training path can be exercised end to end
with no download: ``resolve_data("shapes")`` (or ``model.train(data="shapes")``) generates it on
first use and reuses it afterwards.

Each image holds 1 to 6 filled shapes (``circle, square, triangle, star, cross``) of random size
(8% to 45% of the short image side), colour and, for all but circles, a slight rotation, drawn on a
varied background (flat colour, gradient, smooth noise, stripes, or clutter lines). Shapes may
overlap, but never hide more than half of an earlier shape. Labels are the tight axis-aligned boxes
of each shape's *visible* pixels. Images are not all square, so letterboxing is exercised too.

A :class:`ShapesStyle` sets how hard the images are (object count, size range, overlap, which
backgrounds, grain, tilt). The default style is the set described above; :data:`SHAPES_STYLES`
names the others (``"easy"``: fewer, larger, non-overlapping shapes on calm backgrounds, which a
tiny model learns in a few CPU minutes; ``libreyolo demo`` trains on it). Each style is cached
under its own folder name, so the default set and its manifest do not change.

Generation is deterministic (each image has its own seeded generator, so the same arguments give
byte-identical files, in one process or spread over worker processes: ``LIBREYOLO_DATASET_WORKERS``
in :mod:`libreyolo.data.builtin`), idempotent (a complete dataset with a matching manifest is reused) and
atomic (written into a temporary folder that is renamed into place, so an interrupted run or two
processes racing never leave a half-written dataset behind).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageDraw

from .builtin import PairedSet, build_once, cache_root, check_sizes, default_datasets_dir, sized_params

__all__ = ["BACKGROUNDS", "SHAPES_STYLES", "SHAPE_NAMES", "DrawnShape", "ShapesStyle", "default_datasets_dir",
           "make_shapes_dataset", "render_shapes", "render_shapes_labelled"]

#: Class names, in class-id order.
SHAPE_NAMES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")

_VERSION = "shapes-v1"
_MIN_CONTRAST = 90.0  # minimal RGB distance between a shape and what lies under it

#: Background kinds, in the order the generator draws them from.
BACKGROUNDS: tuple[str, ...] = ("flat", "gradient", "noise", "stripes", "clutter")


@dataclass(frozen=True)
class ShapesStyle:
    """How hard the synthetic images are.

    ``objects``: the least and most shapes per image (fewer when one finds no free place);
    ``extent``: a shape's size as a fraction of the short image side (smallest, largest);
    ``max_hidden``: the fraction of an earlier shape a new one may hide (0: shapes never
    overlap); ``backgrounds``: the kinds drawn from (see :data:`BACKGROUNDS`); ``grain``: the
    probability of pixel noise on a background; ``max_tilt``: the largest rotation of
    non-circles, in degrees; ``extent_px``: the size range in pixels instead, whatever the
    image's size (small-object sets: the same objects on small and large canvases).
    """

    objects: tuple[int, int] = (1, 6)
    extent: tuple[float, float] = (0.08, 0.45)
    max_hidden: float = 0.5
    backgrounds: tuple[str, ...] = BACKGROUNDS
    grain: float = 0.5
    max_tilt: float = 20.0
    extent_px: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        lo, hi = self.objects
        if not 1 <= lo <= hi:
            raise ValueError(f"ShapesStyle.objects must be (least, most) with 1 <= least <= most, got {self.objects}")
        a, b = self.extent
        if not 0.0 < a <= b <= 1.0:
            raise ValueError(f"ShapesStyle.extent must be (smallest, largest) with 0 < smallest <= largest <= 1, "
                             f"got {self.extent}")
        if not 0.0 <= self.max_hidden < 1.0:
            raise ValueError(f"ShapesStyle.max_hidden must be in [0, 1), got {self.max_hidden}")
        unknown = [k for k in self.backgrounds if k not in BACKGROUNDS]
        if not self.backgrounds or unknown:
            raise ValueError(f"ShapesStyle.backgrounds must be a non-empty subset of {BACKGROUNDS}, "
                             f"got {self.backgrounds}")
        if not 0.0 <= self.grain <= 1.0:
            raise ValueError(f"ShapesStyle.grain must be a probability, got {self.grain}")
        if self.extent_px is not None and not 4.0 <= self.extent_px[0] <= self.extent_px[1]:
            raise ValueError(f"ShapesStyle.extent_px must be (smallest, largest) pixels with 4 <= smallest <= "
                             f"largest, got {self.extent_px}")

    def fields(self) -> dict:
        """The style's fields as the manifest and a custom style's name record them (``extent_px``
        only when set, so the styles made before it keep their manifests and names)."""
        out = asdict(self)
        if out["extent_px"] is None:
            del out["extent_px"]
        return out


#: Named styles. ``default`` is the ``shapes`` set; ``easy`` is the demo's: 3 to 6 well-separated
#: shapes of 18% to 40% of the short side on flat, gradient or smooth-noise backgrounds; ``small``
#: is the small-object set (sliced inference, test-time augmentation): 4 to 12 well-separated
#: shapes of 6 to 32 pixels whatever the canvas, on calm backgrounds - on a large canvas
#: (``imgsz=1280``) they are a few pixels once the image is shrunk to a network's input.
SHAPES_STYLES: dict[str, ShapesStyle] = {
    "default": ShapesStyle(),
    "easy": ShapesStyle(objects=(3, 6), extent=(0.18, 0.40), max_hidden=0.0,
                        backgrounds=("flat", "gradient", "noise"), grain=0.3, max_tilt=20.0),
    "small": ShapesStyle(objects=(4, 12), extent=(0.02, 0.1), max_hidden=0.0,
                         backgrounds=("flat", "gradient", "noise"), grain=0.3, max_tilt=20.0, extent_px=(6.0, 32.0)),
}


class DrawnShape(NamedTuple):
    """One shape as drawn: class id, tight box of its visible pixels (x1, y1, x2, y2; x2/y2
    exclusive, in pixels) and its fill colour."""

    cls: int
    box: tuple[int, int, int, int]
    color: tuple[int, int, int]


def make_shapes_dataset(
    root: Path | str | None = None,
    n_train: int = 320,
    n_val: int = 64,
    imgsz: int = 320,
    seed: int = 0,
    style: ShapesStyle | str = "default",
) -> Path:
    """Write (or reuse) the synthetic shapes dataset and return the path of its ``data.yaml``.

    ``root`` defaults to ``<datasets dir>/shapes-v1-<n_train>-<n_val>-<imgsz>-<seed>`` (see
    :func:`default_datasets_dir`); a style other than the default adds its name (a key of
    :data:`SHAPES_STYLES`) or, for a custom :class:`ShapesStyle`, a hash of its fields after
    ``shapes-v1``. ``imgsz`` is the long side of every image; the short side varies. Training and
    validation images come from separate random streams, so the validation split is held out.
    """
    check_sizes("shapes", n_train, n_val, imgsz)
    style_name, style = _style(style)
    params = sized_params(_VERSION, n_train, n_val, imgsz, seed)
    if style_name != "default":  # the default set keeps the manifest (and folder) it always had
        params["style"] = {k: list(v) if isinstance(v, tuple) else v for k, v in style.fields().items()}
    tag = _VERSION if style_name == "default" else f"{_VERSION}-{style_name}"
    root = cache_root(root, f"{tag}-{n_train}-{n_val}-{imgsz}-{seed}")
    return build_once(root, params, "shapes", functools.partial(_generate, style=style),
                      f"{n_train} train + {n_val} val images")


def _style(style: ShapesStyle | str) -> tuple[str, ShapesStyle]:
    """(name, style) of a style given by name or as a :class:`ShapesStyle`; a custom style is
    named by a short hash of its fields (a known one by its key)."""
    if isinstance(style, str):
        if style not in SHAPES_STYLES:
            raise ValueError(f"unknown shapes style {style!r}; known: {', '.join(SHAPES_STYLES)}")
        return style, SHAPES_STYLES[style]
    if not isinstance(style, ShapesStyle):
        raise TypeError(f"style must be a ShapesStyle or one of {', '.join(SHAPES_STYLES)}, got {style!r}")
    for name, known in SHAPES_STYLES.items():
        if style == known:
            return name, known
    digest = hashlib.sha256(json.dumps(style.fields(), sort_keys=True).encode()).hexdigest()[:10]
    return f"custom{digest}", style


def _draw_boxes(rng: np.random.Generator, w: int, h: int, style: ShapesStyle) -> tuple[np.ndarray, str]:
    """One image in ``style`` and its YOLO label text (class, centre x/y, width, height; normalised)."""
    pixels, shapes = render_shapes(rng, w, h, style=style)
    rows = []
    for s in shapes:
        x1, y1, x2, y2 = s.box
        rows.append(f"{s.cls} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} "
                    f"{(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}\n")
    return pixels, "".join(rows)


_NAMES_YAML = "\n".join(f"  {k}: {n}" for k, n in enumerate(SHAPE_NAMES))

#: The ``shapes`` set in the default style (streams 0 / 1); :func:`_generate` swaps in the style.
_SHAPES = PairedSet(
    kind="shapes", version=_VERSION, streams=(0, 1), label_dir="labels", label_suffix=".txt",
    draw=functools.partial(_draw_boxes, style=SHAPES_STYLES["default"]), save_label=Path.write_text,
    data_yaml="# libreyolo built-in synthetic dataset (libreyolo.data.synthetic)\n"
              f"path: .\ntrain: images/train\nval: images/val\nnc: {len(SHAPE_NAMES)}\nnames:\n{_NAMES_YAML}\n",
)


def _generate(out: Path, params: dict, style: ShapesStyle) -> None:
    """Write every image, label, data.yaml and (last) the manifest of the set in ``style`` into ``out``."""
    dataclasses.replace(_SHAPES, draw=functools.partial(_draw_boxes, style=style)).generate(out, params)


# --------------------------------------------------------------------------------------------------
# Rendering.


def render_shapes(
    rng: np.random.Generator, width: int, height: int, plain: bool = False,
    style: ShapesStyle = SHAPES_STYLES["default"],
) -> tuple[np.ndarray, list[DrawnShape]]:
    """Draw one image (HxWx3 uint8 RGB) in ``style`` and return it with its shapes.

    ``plain=True`` uses a flat background with no clutter, which makes the labels checkable pixel
    by pixel (every pixel outside all boxes is the background colour).
    """
    img, shapes, _ = render_shapes_labelled(rng, width, height, plain, style)
    return img, shapes


def render_shapes_labelled(
    rng: np.random.Generator, width: int, height: int, plain: bool = False,
    style: ShapesStyle = SHAPES_STYLES["default"],
) -> tuple[np.ndarray, list[DrawnShape], np.ndarray]:
    """:func:`render_shapes` (the same random draws, so the same image and shapes for the same
    generator state) plus the per-pixel labels: an HxW int16 map holding the class id of the
    shape each pixel shows, -1 where it shows the background (semantic segmentation sets)."""
    img = _flat(rng, width, height) if plain else random_background(rng, width, height, style)
    owner = np.full((height, width), -1, dtype=np.int16)  # which shape each pixel shows
    areas: list[int] = []
    classes: list[int] = []
    colors: list[tuple[int, int, int]] = []
    short = min(width, height)
    lo, hi = style.objects
    for _ in range(int(rng.integers(lo, hi + 1))):
        for _attempt in range(25):
            cls = int(rng.integers(len(SHAPE_NAMES)))
            extent = rng.uniform(*style.extent_px) if style.extent_px else rng.uniform(*style.extent) * short
            mask = shape_mask(rng, cls, extent, width, height, style.max_tilt)
            area = int(mask.sum())
            if area < 16:
                continue
            if not place_shape(rng, img, owner, mask, areas, colors, style.max_hidden):
                continue
            classes.append(cls)
            break
    shapes = []
    for k, (cls, color) in enumerate(zip(classes, colors)):
        ys, xs = np.nonzero(owner == k)
        box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
        shapes.append(DrawnShape(cls, box, color))
    labels = np.full((height, width), -1, dtype=np.int16)
    visible = owner >= 0
    labels[visible] = np.asarray(classes, dtype=np.int16)[owner[visible]]
    return img, shapes, labels


def place_shape(rng: np.random.Generator, img: np.ndarray, owner: np.ndarray, mask: np.ndarray, areas: list[int],
                colors: list[tuple[int, int, int]], max_hidden: float) -> bool:
    """Paint ``mask`` into ``img`` as the next shape when it hides at most ``max_hidden`` of each
    earlier shape and a colour standing out from what it covers is found (:func:`_occlusion_ok`,
    then :func:`_pick_color`: their random draws in that order), recording it in ``owner`` (the
    shape shown at each pixel, -1 for the background), ``areas`` and ``colors``; False, with
    nothing changed, otherwise. The placement rule every built-in shapes set shares."""
    if not _occlusion_ok(owner, mask, areas, max_hidden):
        return False
    color = _pick_color(rng, img, owner, mask, colors)
    if color is None:
        return False
    img[mask] = color
    owner[mask] = len(areas)
    areas.append(int(mask.sum()))
    colors.append(color)
    return True


def _occlusion_ok(owner: np.ndarray, mask: np.ndarray, areas: list[int], max_hidden: float) -> bool:
    """A new shape may hide part of earlier ones, but each must keep ``1 - max_hidden`` of its
    pixels (``max_hidden=0``: a new shape may not touch any earlier one's pixels)."""
    covered = owner[mask]
    covered = covered[covered >= 0]
    if covered.size == 0:
        return True
    if max_hidden <= 0.0:
        return False
    hidden = np.bincount(covered, minlength=len(areas))
    visible = np.bincount(owner[owner >= 0], minlength=len(areas)) - hidden
    return bool(np.all(visible >= (1.0 - max_hidden) * np.asarray(areas)))


def _pick_color(rng: np.random.Generator, img: np.ndarray, owner: np.ndarray, mask: np.ndarray,
                colors: list[tuple[int, int, int]]) -> tuple[int, int, int] | None:
    """A random colour far enough from the background and from any shape it overlaps."""
    under_bg = img[mask & (owner < 0)]
    refs = [under_bg.reshape(-1, 3).mean(0)] if under_bg.size else []
    # Per-pixel check on textured backgrounds: the colour must stand out from most pixels.
    refs += [np.asarray(colors[k], np.float64) for k in np.unique(owner[mask]) if k >= 0]
    sample = under_bg.reshape(-1, 3)[:: max(1, under_bg.shape[0] // 256)].astype(np.float64)
    for _ in range(30):
        c = rng.integers(0, 256, 3).astype(np.float64)
        if any(np.linalg.norm(c - r) < _MIN_CONTRAST for r in refs):
            continue
        if sample.size and np.mean(np.linalg.norm(sample - c, axis=1) < 40) > 0.05:
            continue
        return int(c[0]), int(c[1]), int(c[2])
    return None


def shape_mask(rng: np.random.Generator, cls: int, extent: float, w: int, h: int,
                max_tilt: float = ShapesStyle.max_tilt) -> np.ndarray:
    """Boolean HxW mask of one shape of class ``cls`` whose size is about ``extent`` pixels,
    non-circles rotated by up to ``max_tilt`` degrees."""
    r = extent / 2.0
    cx = rng.uniform(r, w - r)
    cy = rng.uniform(r, h - r)
    im = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(im)
    if cls == 0:  # circle
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    else:
        tilt = math.radians(rng.uniform(-max_tilt, max_tilt))
        draw.polygon(_polygon(cls, cx, cy, r, tilt), fill=255)
    return np.asarray(im) > 0


def _polygon(cls: int, cx: float, cy: float, r: float, tilt: float) -> list[tuple[float, float]]:
    """Vertices of a square, triangle, star or cross of circumradius ~``r``, rotated by ``tilt``."""
    if cls == 1:  # square: half-side chosen so the tilted square stays within the circle
        pts = [(a * r * 0.7, b * r * 0.7) for a, b in ((-1, -1), (1, -1), (1, 1), (-1, 1))]
    elif cls == 2:  # triangle, apex up
        pts = [(r * math.cos(t), r * math.sin(t))
               for t in (-math.pi / 2 + k * 2 * math.pi / 3 for k in range(3))]
    elif cls == 3:  # five-pointed star
        pts = []
        for k in range(10):
            rr = r if k % 2 == 0 else 0.45 * r
            t = -math.pi / 2 + k * math.pi / 5
            pts.append((rr * math.cos(t), rr * math.sin(t)))
    elif cls == 4:  # plus-shaped cross
        a, b = r * 0.75, r * 0.25
        pts = [(-b, -a), (b, -a), (b, -b), (a, -b), (a, b), (b, b),
               (b, a), (-b, a), (-b, b), (-a, b), (-a, -b), (-b, -b)]
    else:
        raise ValueError(f"unknown shape class {cls}")
    c, s = math.cos(tilt), math.sin(tilt)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]


def _flat(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    img = np.empty((h, w, 3), np.uint8)
    img[:] = rng.integers(0, 256, 3, dtype=np.uint8)
    return img


def random_background(rng: np.random.Generator, w: int, h: int,
                style: ShapesStyle = SHAPES_STYLES["default"]) -> np.ndarray:
    """A random background of one of ``style.backgrounds``: flat, gradient, smooth noise,
    stripes or clutter lines; grain on a ``style.grain`` fraction of them."""
    kind = style.backgrounds[int(rng.integers(len(style.backgrounds)))]
    if kind == "flat":
        img = _flat(rng, w, h)
    elif kind == "gradient":  # linear gradient between two colours along a random direction
        t = rng.uniform(0, 2 * math.pi)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        proj = xx * math.cos(t) + yy * math.sin(t)
        proj = (proj - proj.min()) / max(float(np.ptp(proj)), 1e-6)
        a, b = rng.integers(0, 256, (2, 3)).astype(np.float32)
        img = (a + proj[..., None] * (b - a)).astype(np.uint8)
    elif kind == "noise":  # smooth colour noise plus fine grain
        g = int(rng.integers(3, 9))
        coarse = rng.integers(0, 256, (g, g, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR)).copy()
    elif kind == "stripes":  # at a random angle and period
        t = rng.uniform(0, math.pi)
        period = rng.uniform(6, 40)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        phase = ((xx * math.cos(t) + yy * math.sin(t)) / period) % 1.0 < 0.5
        a, b = rng.integers(0, 256, (2, 3), dtype=np.uint8)
        img = np.where(phase[..., None], a, b).astype(np.uint8)
    else:  # clutter: random lines over a flat colour
        img = _flat(rng, w, h)
        pil = Image.fromarray(img)
        draw = ImageDraw.Draw(pil)
        for _ in range(int(rng.integers(5, 21))):
            x0, x1 = rng.uniform(0, w, 2)
            y0, y1 = rng.uniform(0, h, 2)
            color = tuple(int(v) for v in rng.integers(0, 256, 3))
            draw.line([(x0, y0), (x1, y1)], fill=color, width=int(rng.integers(1, 4)))
        img = np.asarray(pil).copy()
    if rng.random() < style.grain:  # pixel noise
        noise = rng.normal(0.0, rng.uniform(3, 12), img.shape)
        img = np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(img)


