"""Prompts of promptable segmentation: checking them, and mapping them into the network's frame.

A prompt is foreground / background points (``labels`` 1 / 0; all foreground when no labels are
given) and/or boxes ``x1, y1, x2, y2``, in the original image's pixel coordinates. Bad prompts are
refused with an error that names the prompt and the value: an empty list, a malformed point or
box, labels that do not pair with the points, a label other than 0 / 1, a box with x2 < x1 or
y2 < y1, and any point or box corner outside the image ([0, w] x [0, h]).

The network sees points and box corners in its ``size`` x ``size`` frame, where the image was
resized so its longer side is ``size`` (:func:`libreyolo.ops.preprocess.long_side_size`): each
coordinate is multiplied by the resized over the original width (x) or height (y), as SAM does.
:func:`pack` puts points, labels and boxes of one prompt into one float32 row, so a prompt call
uploads one small tensor; :func:`unpack` splits it again inside the stage (static sizes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["CENTER", "Prompt", "center_box", "default_prompt", "parse_prompt", "pack", "takes_points", "unpack"]

#: ``points="center"``: one foreground point at the centre of each image (the CLI's default);
#: ``boxes="center"``: one box around the centre, the middle half of the image's width and height
#: (the default of a family prompted by boxes only, PicoSAM3)
CENTER = "center"


def center_box(h: int, w: int) -> np.ndarray:
    """(1, 4) the box ``boxes="center"`` means on an (h, w) image: x from w/4 to 3w/4, y from
    h/4 to 3h/4."""
    return np.array([[w / 4, h / 4, 3 * w / 4, 3 * h / 4]], dtype=np.float64)


def takes_points(model: Any) -> bool:
    """Whether ``model``'s family takes point prompts (a box-only family, PicoSAM3, declares
    ``GRID_PROMPTS = False``: no points, so no point grid either)."""
    return bool(getattr(model, "GRID_PROMPTS", True))


def default_prompt(model: Any) -> dict[str, str]:
    """The prompt used where the caller gives none and one is needed (the CLI, ``libreyolo
    bench``): one foreground point at the centre, or the centre box for a box-only family."""
    return {"points": CENTER} if takes_points(model) else {"boxes": CENTER}


@dataclass(frozen=True)
class Prompt:
    """One prompt in original-image pixels: ``points`` (P, 2) x, y; ``labels`` (P,) 1 foreground,
    0 background; ``boxes`` (K, 4) x1, y1, x2, y2 (float64 numpy). ``center``: the points are to be
    the image's centre, ``center_box``: the box is to be the centre box (:func:`center_box`) (both
    resolved per image by :meth:`for_image`)."""

    points: np.ndarray
    labels: np.ndarray
    boxes: np.ndarray
    center: bool = False
    center_box: bool = False

    @property
    def counts(self) -> tuple[int, int]:
        """(points, boxes): what a prompt stage's shapes depend on."""
        return (1 if self.center else len(self.points)), (1 if self.center_box else len(self.boxes))

    def for_image(self, h: int, w: int) -> Prompt:
        """This prompt for an (h, w) image: the centres resolved, every point and corner checked."""
        p = self
        if self.center or self.center_box:
            p = Prompt(np.array([[w / 2, h / 2]]) if self.center else self.points,
                       np.ones(1, dtype=np.int64) if self.center else self.labels,
                       center_box(h, w) if self.center_box else self.boxes)
        for i, (x, y) in enumerate(p.points):
            if not (0 <= x <= w and 0 <= y <= h):
                raise ValueError(f"prompt point {i} ({x:g}, {y:g}) is outside the {w}x{h} image "
                                 f"(x must be in [0, {w}], y in [0, {h}])")
        for i, (x1, y1, x2, y2) in enumerate(p.boxes):
            if not (0 <= x1 <= w and 0 <= x2 <= w and 0 <= y1 <= h and 0 <= y2 <= h):
                raise ValueError(f"prompt box {i} ({x1:g}, {y1:g}, {x2:g}, {y2:g}) is outside the {w}x{h} image")
        return p


def _rows(name: str, value: Any, width: int, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of {what}, got {value!r}") from None
    if a.ndim == 1 and a.size == width:   # a single point / box
        a = a[None]
    if a.size == 0:
        raise ValueError(f"{name} is an empty list: give at least one {what.rstrip('s')} or leave {name} out")
    if a.ndim != 2 or a.shape[1] != width:
        raise ValueError(f"{name} must be a list of {what}, got an array of shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must hold finite numbers, got {value!r}")
    return a


def parse_prompt(points: Any = None, labels: Any = None, boxes: Any = None) -> Prompt:
    """Check a prompt's structure (everything that needs no image) and return it as arrays."""
    if points is None and boxes is None:
        if labels is not None:
            raise ValueError("labels were given without points: labels say which points are foreground (1) "
                             "or background (0)")
        raise ValueError("no prompt: give points=[[x, y], ...] (with labels=[1, 0, ...]) and/or "
                         "boxes=[[x1, y1, x2, y2], ...] in the image's pixel coordinates")
    center = isinstance(points, str)
    if center and points != CENTER:
        raise ValueError(f"points must be a list of [x, y] pairs or {CENTER!r}, got {points!r}")
    pts = np.zeros((0, 2)) if points is None or center else _rows("points", points, 2, "[x, y] points")
    if labels is None:
        lab = np.ones(1 if center else len(pts), dtype=np.int64)
    else:
        if center:
            raise ValueError(f"points={CENTER!r} is one foreground point; it takes no labels")
        if points is None:
            raise ValueError("labels were given without points")
        if isinstance(labels, torch.Tensor):
            labels = labels.detach().cpu().numpy()
        lab = np.asarray(labels).reshape(-1)
        if len(lab) != len(pts):
            raise ValueError(f"labels has {len(lab)} value(s) but points has {len(pts)}: give one label "
                             "(1 foreground, 0 background) per point")
        try:
            labf = lab.astype(np.float64)
        except (TypeError, ValueError):
            labf = np.full(len(lab), np.nan)
        if not np.all(np.isin(labf, (0, 1))):
            raise ValueError(f"labels must be 0 (background) or 1 (foreground), got {labels!r}")
        lab = labf.astype(np.int64)
    cbox = isinstance(boxes, str)
    if cbox and boxes != CENTER:
        raise ValueError(f"boxes must be a list of [x1, y1, x2, y2] boxes or {CENTER!r}, got {boxes!r}")
    bx = np.zeros((0, 4)) if boxes is None or cbox else _rows("boxes", boxes, 4, "[x1, y1, x2, y2] boxes")
    for i, (x1, y1, x2, y2) in enumerate(bx):
        if x2 < x1 or y2 < y1:
            raise ValueError(f"prompt box {i} ({x1:g}, {y1:g}, {x2:g}, {y2:g}) has x2 < x1 or y2 < y1: "
                             "boxes are [x1, y1, x2, y2] with the top-left corner first")
    return Prompt(pts, lab, bx, center, cbox)


def pack(prompt: Prompt, h: int, w: int, rh: int, rw: int) -> np.ndarray:
    """(1, 3P + 4K) float32: the points (x, y per point) and box corners scaled from the (h, w)
    image to its (rh, rw) resized copy in the network's frame, then the labels."""
    sx, sy = rw / w, rh / h
    pts = prompt.points * np.array([sx, sy])
    bx = prompt.boxes * np.array([sx, sy, sx, sy])
    row = np.concatenate([pts.reshape(-1), prompt.labels.astype(np.float64), bx.reshape(-1)])
    return row.astype(np.float32)[None]


def unpack(packed: torch.Tensor, n_points: int, n_boxes: int):
    """(B, 3P + 4K) -> points (B, P, 2) or None, labels (B, P) or None, boxes (B, K, 4) or None."""
    b = packed.shape[0]
    p2 = 2 * n_points
    pts = packed[:, :p2].reshape(b, n_points, 2) if n_points else None
    lab = packed[:, p2:p2 + n_points] if n_points else None
    boxes = packed[:, p2 + n_points:].reshape(b, n_boxes, 4) if n_boxes else None
    return pts, lab, boxes


def parse_cli(points: str | None, labels: str | None, boxes: str | None, grid: bool = False,
              default: dict[str, str] | None = None) -> dict[str, Any]:
    """``libreyolo predict`` text options -> predict options: ``points="x,y;x,y"``,
    ``labels="1,0"``, ``boxes="x1,y1,x2,y2;..."`` (either may be ``center``); neither points nor
    boxes: ``default`` (:func:`default_prompt` of the model; ``points="center"`` when not given),
    unless ``grid``: ``prompts=grid`` asks for automatic masks, which take no prompt."""
    def rows(name: str, text: str, width: int):
        out = []
        for part in text.split(";"):
            try:
                vals = [float(v) for v in part.split(",")]
            except ValueError:
                raise ValueError(f"{name} must be numbers: {'x,y;x,y' if width == 2 else 'x1,y1,x2,y2;...'}, "
                                 f"got {text!r}") from None
            if len(vals) != width:
                raise ValueError(f"{name}: each entry needs {width} numbers separated by commas, got {part!r}")
            out.append(vals)
        return out
    opts: dict[str, Any] = {}
    if points:
        opts["points"] = CENTER if points == CENTER else rows("points", points, 2)
    if labels:
        try:
            opts["labels"] = [int(v) for v in labels.split(",")]
        except ValueError:
            raise ValueError(f"labels must be 0/1 separated by commas, got {labels!r}") from None
    if boxes:
        opts["boxes"] = CENTER if boxes == CENTER else rows("boxes", boxes, 4)
    if "points" not in opts and "boxes" not in opts and not grid:
        opts.update({"points": CENTER} if default is None else default)
    return opts
