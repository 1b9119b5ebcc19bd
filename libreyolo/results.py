"""Prediction results: :class:`Boxes` (detections of one image) and :class:`Results` (one image).

``Boxes`` wraps an (n, 6) ``x1, y1, x2, y2, conf, cls`` array in original-image pixels and derives
the other box formats on demand; it works the same whether the data is a torch tensor (any device)
or, after :meth:`Boxes.numpy`, a numpy array. ``Results`` pairs the boxes with the original image
and offers the user-facing outputs: a JSON summary, an annotated image, saving and showing.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont, ImageShow

from .atomic import atomic_write

__all__ = ["Boxes", "Results", "PALETTE", "class_color"]

log = logging.getLogger(__name__)

#: Whether :meth:`Results.show` has already said that it cannot show anything (said once a process).
_warned_cannot_show = False

#: Fixed per-class colours (RGB), picked to be distinguishable on photos; class k uses PALETTE[k % 20].
PALETTE: tuple[tuple[int, int, int], ...] = (
    (230, 57, 70), (255, 140, 0), (240, 200, 20), (60, 180, 75), (0, 170, 170),
    (30, 144, 255), (90, 80, 220), (170, 60, 200), (240, 80, 160), (128, 128, 0),
    (0, 128, 96), (200, 100, 60), (110, 200, 240), (160, 220, 60), (255, 110, 110),
    (70, 70, 160), (200, 160, 255), (150, 75, 0), (0, 210, 120), (120, 120, 120),
)


def class_color(cls: int) -> tuple[int, int, int]:
    """The drawing colour of class ``cls`` (stable across runs and images)."""
    return PALETTE[int(cls) % len(PALETTE)]


_Array = TypeVar("_Array", torch.Tensor, np.ndarray)


def _xyxy_to_xywh(b: _Array, out: _Array) -> _Array:
    """Fill ``out`` (shaped and typed like ``b``) with the centre/size form of the corners ``b``."""
    out[:, 0] = (b[:, 0] + b[:, 2]) / 2
    out[:, 1] = (b[:, 1] + b[:, 3]) / 2
    out[:, 2] = b[:, 2] - b[:, 0]
    out[:, 3] = b[:, 3] - b[:, 1]
    return out


_Rows = TypeVar("_Rows", bound="DataRows")


class DataRows:
    """What a task's result type holding one tensor or array of rows (``_data``, one row per
    instance) shares: its shape and length, and the copies on the CPU, as numpy, or moved/cast
    by ``to``; a subclass makes its own kind of object from new data (``_new``)."""

    _data: Any

    def _new(self: _Rows, data: Any) -> _Rows:
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    def __len__(self) -> int:
        return int(self._data.shape[0])

    def cpu(self: _Rows) -> _Rows:
        return self._new(self._data.cpu() if isinstance(self._data, torch.Tensor) else self._data)

    def numpy(self: _Rows) -> _Rows:
        d = self._data
        return self._new(d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else d)

    def to(self: _Rows, *args: Any, **kwargs: Any) -> _Rows:
        d = self._data
        t = d if isinstance(d, torch.Tensor) else torch.as_tensor(d)
        return self._new(t.to(*args, **kwargs))


class PixelMap:
    """A per-pixel (H, W) field of one image's result (a torch tensor on any device, or a numpy
    array after :meth:`numpy`): the checks, fields and conversions the tasks' maps share
    (``SemanticMask``, ``DepthMap``, ``Alpha``). A subclass names what it holds (``WHAT``, for the
    shape error) and checks its dtype in :meth:`_check_dtype`; conversions keep the subclass."""

    WHAT = "map"

    def __init__(self, data: torch.Tensor | np.ndarray):
        name = type(self).__name__
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise TypeError(f"{name} data must be a torch tensor or numpy array, got {type(data).__name__}")
        if data.ndim != 2:
            raise ValueError(f"{name} data must be an (H, W) {self.WHAT}, got shape {tuple(data.shape)}")
        self._check_dtype(data)
        self._data = data

    def _check_dtype(self, data: torch.Tensor | np.ndarray) -> None:
        """Raise ValueError when ``data``'s dtype is not what this map holds."""

    @staticmethod
    def _is_float(data: torch.Tensor | np.ndarray) -> bool:
        return data.dtype.is_floating_point if isinstance(data, torch.Tensor) else data.dtype.kind == "f"

    @property
    def data(self) -> torch.Tensor | np.ndarray:
        """The (H, W) map."""
        return self._data

    @property
    def shape(self) -> tuple[int, int]:
        h, w = self._data.shape   # (H, W): checked in __init__
        return int(h), int(w)

    orig_shape = shape

    def cpu(self):
        d = self._data
        return type(self)(d.cpu() if isinstance(d, torch.Tensor) else d)

    def numpy(self):
        d = self._data
        return type(self)(d.detach().cpu().numpy() if isinstance(d, torch.Tensor) else d)

    def to(self, *args: Any, **kwargs: Any):
        """Move/cast the map like ``torch.Tensor.to`` (numpy data becomes a tensor first)."""
        d = self._data
        if isinstance(d, np.ndarray):
            d = torch.from_numpy(np.ascontiguousarray(d))
        return type(self)(d.to(*args, **kwargs))


class Boxes:
    """Detections of one image: ``data`` is (n, 6) ``x1, y1, x2, y2, conf, cls`` in pixels.

    ``orig_shape`` is the (height, width) of the original image, used by the normalized formats.
    ``id``: the (n,) track ids when the boxes come from ``model.track`` (None otherwise).
    Indexing (int, slice, bool mask or index array) returns a new ``Boxes``, always 2-D.
    """

    def __init__(self, data: torch.Tensor | np.ndarray, orig_shape: tuple[int, int],
                 id: torch.Tensor | np.ndarray | None = None):
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise TypeError(f"Boxes data must be a torch tensor or numpy array, got {type(data).__name__}")
        if data.ndim != 2 or data.shape[1] != 6:
            raise ValueError(
                f"Boxes data must have shape (n, 6) = x1, y1, x2, y2, conf, cls; got {tuple(data.shape)}"
            )
        if id is not None and (id.ndim != 1 or id.shape[0] != data.shape[0]):
            raise ValueError(f"Boxes id must have shape ({data.shape[0]},), one per box; got {tuple(id.shape)}")
        self._data = data
        self._orig_shape = (int(orig_shape[0]), int(orig_shape[1]))
        self._id = id

    # ---- raw fields ----------------------------------------------------------------------------
    @property
    def data(self) -> torch.Tensor | np.ndarray:
        """The (n, 6) array: x1, y1, x2, y2, conf, cls."""
        return self._data

    @property
    def orig_shape(self) -> tuple[int, int]:
        """(height, width) of the image the boxes refer to."""
        return self._orig_shape

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of ``data``: (n, 6)."""
        return tuple(self._data.shape)

    @property
    def xyxy(self) -> torch.Tensor | np.ndarray:
        """(n, 4) corners x1, y1, x2, y2 in pixels (a view of ``data``)."""
        return self._data[:, :4]

    @property
    def conf(self) -> torch.Tensor | np.ndarray:
        """(n,) confidence scores."""
        return self._data[:, 4]

    @property
    def cls(self) -> torch.Tensor | np.ndarray:
        """(n,) class indices (stored as floats, like the rest of ``data``)."""
        return self._data[:, 5]

    @property
    def id(self) -> torch.Tensor | np.ndarray | None:
        """(n,) int64 track ids (``model.track``), or None for boxes that are not tracked."""
        return self._id

    @property
    def is_track(self) -> bool:
        """Whether the boxes carry track ids."""
        return self._id is not None

    # ---- derived formats -----------------------------------------------------------------------
    @property
    def xywh(self) -> torch.Tensor | np.ndarray:
        """(n, 4) centre x, centre y, width, height in pixels (a new array)."""
        b = self.xyxy
        if isinstance(b, torch.Tensor):
            return _xyxy_to_xywh(b, torch.empty_like(b))
        return _xyxy_to_xywh(b, np.empty_like(b))

    def _normalize(self, b: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        h, w = self._orig_shape
        scale = [w, h, w, h]
        if isinstance(b, torch.Tensor):
            dtype = b.dtype if b.dtype.is_floating_point else torch.float32
            return b.to(dtype) / torch.tensor(scale, dtype=dtype, device=b.device)
        np_dtype = b.dtype if b.dtype.kind == "f" else np.float64
        return b.astype(np_dtype, copy=False) / np.asarray(scale, dtype=np_dtype)

    @property
    def xyxyn(self) -> torch.Tensor | np.ndarray:
        """(n, 4) corners divided by the image width/height, so in [0, 1] for boxes inside it."""
        return self._normalize(self.xyxy)

    @property
    def xywhn(self) -> torch.Tensor | np.ndarray:
        """(n, 4) centre x, centre y, width, height divided by the image width/height."""
        return self._normalize(self.xywh)

    # ---- container protocol and conversions ----------------------------------------------------
    def __len__(self) -> int:
        return int(self._data.shape[0])

    def __getitem__(self, index: Any) -> Boxes:
        data = self._data
        if isinstance(data, torch.Tensor) and isinstance(index, np.ndarray):
            index = torch.as_tensor(index, device=data.device)
        elif isinstance(data, torch.Tensor) and isinstance(index, torch.Tensor):
            index = index.to(data.device)
        elif isinstance(data, np.ndarray) and isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        picked = data[index]
        ids = None
        if self._id is not None:
            ids = self._id[index]
            ids = ids.reshape(-1) if isinstance(ids, (torch.Tensor, np.ndarray)) else ids
        if picked.ndim == 1:  # an integer index: keep the (1, 6) layout
            picked = picked[None]
        return Boxes(picked, self._orig_shape, ids)

    def cpu(self) -> Boxes:
        """The same boxes with tensor data on the CPU (numpy data is returned as is)."""
        data = self._data.cpu() if isinstance(self._data, torch.Tensor) else self._data
        ids = self._id.cpu() if isinstance(self._id, torch.Tensor) else self._id
        return Boxes(data, self._orig_shape, ids)

    def numpy(self) -> Boxes:
        """The same boxes with data as a numpy array (all properties then return numpy)."""
        data, ids = self._data, self._id
        if isinstance(data, torch.Tensor):
            data = data.detach().cpu().numpy()
        if isinstance(ids, torch.Tensor):
            ids = ids.cpu().numpy()
        return Boxes(data, self._orig_shape, ids)

    def to(self, *args: Any, **kwargs: Any) -> Boxes:
        """Move/cast the data like ``torch.Tensor.to`` (numpy data is turned into a tensor first)."""
        data, ids = self._data, self._id
        if isinstance(data, np.ndarray):
            data = torch.from_numpy(np.ascontiguousarray(data))
        moved = data.to(*args, **kwargs)
        if ids is not None:  # ids stay int64: only the device follows
            ids = torch.as_tensor(ids).to(moved.device)
        return Boxes(moved, self._orig_shape, ids)

    def __repr__(self) -> str:
        if isinstance(self._data, torch.Tensor):
            where = f"tensor on {self._data.device}"
        else:
            where = "numpy"
        ids = "" if self._id is None else f"\nid: {self._id}"
        return (
            f"Boxes(n={len(self)}, orig_shape={self._orig_shape}, {where}, dtype={self._data.dtype})\n"
            f"data (x1, y1, x2, y2, conf, cls):\n{self._data}{ids}"
        )


def _to_numpy_image(img: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(img, torch.Tensor):
        img = img.detach().cpu().numpy()
    if not isinstance(img, np.ndarray):
        raise TypeError(f"orig_img must be a numpy array or torch tensor, got {type(img).__name__}")
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(
            f"orig_img must be HxWx3 uint8 RGB, got shape {tuple(img.shape)} and dtype {img.dtype}"
        )
    return img


@functools.lru_cache(maxsize=16)
def load_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """PIL's bundled font at ``size`` px; the fixed-size bitmap font on Pillow < 10.1."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: no size argument
        return ImageFont.load_default()


class Results:
    """The prediction for one image.

    Attributes: ``orig_img`` (HxWx3 uint8 RGB numpy), ``orig_shape`` (h, w), ``path`` (file path or
    ``imageN``), ``names`` (class index -> name), ``boxes`` (:class:`Boxes` or None) and ``speed``
    (milliseconds per stage: ``preprocess``, ``inference``, ``postprocess``; None when not measured).

    Tasks other than detection fill their own field instead of ``boxes`` (``probs`` for
    classification, ``masks`` for semantic segmentation, ``depth`` for depth estimation, ``alpha`` for
    matting, ``texts`` for OCR, ``keypoints`` for pose, next to ``boxes``; ``points`` for point
    detection; instance segmentation
    fills ``masks`` beside the boxes; ``obb`` for oriented boxes; LibreYOLO 1.6.0's names
    ``semantic_mask``, ``depth_map``, ``matte`` and ``ocr`` are the same fields). Such a field is an
    object of the task's result type (``libreyolo/tasks/<task>/``) with ``plot_on(image, names) -> image``,
    ``summary(names, decimals)``, and ``cpu()`` / ``numpy()`` / ``to(...)``; :meth:`plot`,
    :meth:`summary` and the conversions use it.
    """

    #: the task fields besides ``boxes``, in drawing order (masks under labels)
    FIELDS: tuple[str, ...] = ("alpha", "masks", "depth", "probs", "texts", "keypoints", "obb")
    FIELDS += ("embedding",)   # embed: the image embedding (tasks/embed)
    FIELDS += ("panoptic",)   # the panoptic task's segment map (tasks/panoptic)
    FIELDS += ("image",)   # restore: the restored picture (tasks/restore/results.py)
    FIELDS += ("points",)   # point detection (tasks/point): object centres
    #: image formats :meth:`save` can write a cut-out (RGBA) to
    RGBA_FORMATS = ("PNG", "WEBP", "TIFF")

    def __init__(
        self,
        orig_img: np.ndarray | torch.Tensor,
        path: str,
        names: dict[int, str],
        boxes: Boxes | None = None,
        speed: dict[str, float | None] | None = None,
        *,
        probs: Any = None,
        masks: Any = None,
        depth: Any = None,
        alpha: Any = None,
        texts: Any = None,
        keypoints: Any = None,
        obb: Any = None,
        embedding: Any = None,
        panoptic: Any = None,
        image: Any = None,
        points: Any = None,
    ):
        self.orig_img: np.ndarray = _to_numpy_image(orig_img)
        self.orig_shape: tuple[int, int] = (int(self.orig_img.shape[0]), int(self.orig_img.shape[1]))
        self.path = str(path)
        # A list of names (index = class) is accepted too, as checkpoints sometimes store one.
        self.names = dict(enumerate(names)) if isinstance(names, (list, tuple)) else dict(names)
        self.boxes = boxes
        self.probs = probs
        self.masks = masks
        self.depth = depth
        self.alpha = alpha
        self.texts = texts
        self.keypoints = keypoints
        self.obb = obb
        self.embedding = embedding
        self.panoptic = panoptic
        self.image = image
        self.points = points
        self.saved_to: str | None = None   # set by predict(save=True)
        self.save_dir: str | None = None   # the folder predict(save=True) wrote into
        # video frames (set by predict): position in the source, seconds since its first frame,
        # position of the source in a .streams list; None for images
        self.frame_index: int | None = None
        self.timestamp: float | None = None
        self.stream: int | None = None
        # model.track: each tracked id's recent box centres (oldest first), drawn by plot()
        self.trails: dict[int, list[tuple[float, float]]] | None = None
        self.speed: dict[str, float | None] = (
            dict(speed) if speed is not None
            else {"preprocess": None, "inference": None, "postprocess": None}
        )

    # LibreYOLO 1.6.0's names of the task fields, the same objects (read and written through)
    @property
    def semantic_mask(self) -> Any:
        """``masks`` under LibreYOLO 1.6.0's name, when it holds a semantic segmentation (a
        promptable segmentation's masks are ``masks`` there too); else None."""
        from .tasks.semantic.results import SemanticMask
        return self.masks if isinstance(self.masks, SemanticMask) else None

    @semantic_mask.setter
    def semantic_mask(self, value: Any) -> None:
        self.masks = value

    depth_map = property(lambda self: self.depth, lambda self, v: setattr(self, "depth", v),
                         doc="``depth`` under LibreYOLO 1.6.0's name")
    matte = property(lambda self: self.alpha, lambda self, v: setattr(self, "alpha", v),
                     doc="``alpha`` under LibreYOLO 1.6.0's name")
    ocr = property(lambda self: self.texts, lambda self, v: setattr(self, "texts", v),
                   doc="``texts`` under LibreYOLO 1.6.0's name")
    restored = property(lambda self: self.image, lambda self, v: setattr(self, "image", v),
                        doc="``image`` (restore) under LibreYOLO 1.6.0's name")

    def __len__(self) -> int:
        if self.boxes is None and self.obb is not None:   # oriented boxes stand in for boxes
            return len(self.obb)
        if self.boxes is None and self.points is not None:   # as do points (the point task)
            return len(self.points)
        return 0 if self.boxes is None else len(self.boxes)

    def __getitem__(self, index: Any) -> Any:
        # One image's Results is what model(image) returns; indexing it is refused rather than
        # read as either of the two meanings code may have had (the first image of a list, or the
        # first detection as in LibreYOLO 1.6.0).
        raise TypeError("a Results is the prediction for one image (model(image) returns it directly, a list "
                        "only for several images): use it without [0]; detections are result.boxes[i]")

    def _fields(self) -> list[tuple[str, Any]]:
        return [(f, getattr(self, f)) for f in self.FIELDS if getattr(self, f) is not None]

    def __repr__(self) -> str:
        extra = "".join(f", {f}={v!r}" for f, v in self._fields())
        return (
            f"Results(path={self.path!r}, orig_shape={self.orig_shape}, boxes={len(self)}{extra}, "
            f"classes={len(self.names)}, speed={self.speed})"
        )

    def _convert(self, how: str, *args: Any, **kwargs: Any) -> Results:
        def conv(v):
            return None if v is None else getattr(v, how)(*args, **kwargs)
        out = Results(self.orig_img, self.path, self.names, conv(self.boxes), self.speed,
                      **{f: conv(v) for f, v in self._fields()})
        out.frame_index, out.timestamp, out.stream = self.frame_index, self.timestamp, self.stream
        out.trails = self.trails
        return out

    def cpu(self) -> Results:
        """The same result with its data (boxes, probs, masks, depth) on the CPU."""
        return self._convert("cpu")

    def numpy(self) -> Results:
        """The same result with its data as numpy arrays."""
        return self._convert("numpy")

    def to(self, *args: Any, **kwargs: Any) -> Results:
        """The same result with its data moved/cast like ``torch.Tensor.to``."""
        return self._convert("to", *args, **kwargs)

    def _rows(self) -> np.ndarray:
        """Box data as a float64 (n, 6) numpy array, fetched from the device once."""
        if self.boxes is None:
            return np.zeros((0, 6), dtype=np.float64)
        data = self.boxes.data
        if isinstance(data, torch.Tensor):
            data = data.detach().float().cpu().numpy()
        return np.asarray(data, dtype=np.float64)

    def _ids(self) -> list[int | None]:
        """The track id of each box (None for every box when they are not tracked)."""
        ids = None if self.boxes is None else self.boxes.id
        if ids is None:
            return [None] * len(self)
        return [int(i) for i in (ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else ids)]

    def _name(self, cls: int) -> str:
        return self.names.get(cls, str(cls))

    def summary(self, normalize: bool = False, decimals: int = 5) -> Any:
        """One dict per box: name, class, confidence and box corners (plain Python numbers);
        for the other tasks, their field's summary (classification: the top-5 classes).

        ``normalize=True`` divides the corners by the image width/height.
        """
        if self.boxes is None and self._fields():
            parts = {f: v.summary(self.names, decimals) for f, v in self._fields()}
            return next(iter(parts.values())) if len(parts) == 1 else parts
        h, w = self.orig_shape
        out: list[dict[str, Any]] = []
        # per-instance fields beside the boxes (instance masks: area and polygons), one row per box
        per_box = [v.instance_rows(decimals) for _, v in self._fields() if hasattr(v, "instance_rows")]
        for i, ((x1, y1, x2, y2, conf, cls), tid) in enumerate(zip(self._rows(), self._ids())):
            if normalize:
                x1, x2, y1, y2 = x1 / w, x2 / w, y1 / h, y2 / h
            c = int(cls)
            row = {
                "name": self._name(c),
                "class": c,
                "confidence": round(float(conf), decimals),
                "box": {
                    "x1": round(float(x1), decimals),
                    "y1": round(float(y1), decimals),
                    "x2": round(float(x2), decimals),
                    "y2": round(float(y2), decimals),
                },
            }
            if tid is not None:
                row["track_id"] = tid
            if self.keypoints is not None:   # pose: the instance's keypoints
                row["keypoints"] = self.keypoints.instance_summary(len(out), normalize, decimals)
            for rows in per_box:   # instance segmentation: the instance's mask area and polygons
                row.update(rows[i])
            out.append(row)
        return out

    def to_json(self, normalize: bool = False, decimals: int = 5) -> str:
        """:meth:`summary` as a JSON string."""
        return json.dumps(self.summary(normalize=normalize, decimals=decimals))

    def plot(
        self,
        line_width: int | None = None,
        font_size: float | None = None,
        labels: bool = True,
        conf: bool = True,
    ) -> np.ndarray:
        """Draw the boxes on a copy of ``orig_img`` and return it (HxWx3 uint8 RGB).

        Each class has its own palette colour. With ``labels`` a filled tag ``"name 0.87"`` (or just
        the name when ``conf`` is False) sits above the box, or just inside it when the box touches
        the top edge. Tracked boxes (``model.track``) are coloured by track id, their tag starts
        with ``"id 7"`` and each id's recent centres (``trails``) are drawn as a line.
        ``line_width``/``font_size`` default to values scaled to the image size.
        """
        h, w = self.orig_shape
        lw = int(line_width) if line_width is not None else max(2, round((h + w) / 2 * 0.003))
        lw = max(1, lw)
        fs = int(round(font_size)) if font_size is not None else max(12, round((h + w) / 2 * 0.02))
        base = self.orig_img.copy()
        for _, field in self._fields():
            base = field.plot_on(base, self.names)
        image = Image.fromarray(base)
        draw = ImageDraw.Draw(image)
        font = load_font(max(1, fs))
        pad = max(1, lw // 2 + 1)
        text_h = font.getbbox("Agy|")[3]

        for trail_id, points in (self.trails or {}).items():
            if len(points) > 1:
                draw.line([(float(x), float(y)) for x, y in points], fill=class_color(int(trail_id)),
                          width=max(1, lw), joint="curve")
        for (x1, y1, x2, y2, score, cls), tid in zip(self._rows(), self._ids()):
            if not np.all(np.isfinite([x1, y1, x2, y2])):
                continue
            # Clip to the image and order the corners so PIL never sees an inverted rectangle.
            xa, xb = sorted((min(max(x1, 0.0), w - 1.0), min(max(x2, 0.0), w - 1.0)))
            ya, yb = sorted((min(max(y1, 0.0), h - 1.0), min(max(y2, 0.0), h - 1.0)))
            color = class_color(int(cls) if tid is None else tid)
            draw.rectangle((xa, ya, xb, yb), outline=color, width=lw)
            if not labels:
                continue
            text = f"{self._name(int(cls))} {score:.2f}" if conf else self._name(int(cls))
            if tid is not None:
                text = f"id {tid} {text}"
            tw = draw.textlength(text, font=font)
            tag_w, tag_h = tw + 2 * pad, text_h + 2 * pad
            tx = min(xa, max(0.0, w - tag_w))  # keep the tag inside the right edge
            ty = ya - tag_h if ya - tag_h >= 0 else ya  # above the box, else just inside it
            draw.rectangle((tx, ty, tx + tag_w - 1, ty + tag_h - 1), fill=color)
            luminance = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2]
            ink = (0, 0, 0) if luminance > 150 else (255, 255, 255)
            draw.text((tx + pad, ty + pad), text, fill=ink, font=font)
        return np.array(image, dtype=np.uint8)

    def _cutout_field(self) -> Any:
        """The task field that saves as a cut-out (one with ``rgba(image)``: matting), or None."""
        return next((v for _, v in self._fields() if hasattr(v, "rgba")), None)

    def _picture_field(self) -> Any:
        """The task field that saves as a picture of its own (restore: the restored image), or None."""
        return next((v for _, v in self._fields() if getattr(v, "SAVES_ITSELF", False)), None)

    @property
    def save_suffix(self) -> str:
        """The file suffix :meth:`save` writes by default: ``.png`` for a cut-out, else ``.jpg``."""
        if self._picture_field() is not None:   # restore: the restored picture, lossless
            return ".png"
        return ".png" if self._cutout_field() is not None else ".jpg"

    def _default_filename(self) -> str:
        stem = Path(self.path).stem or "image"
        return f"{stem}_pred{self.save_suffix}"

    def save(self, filename: str | os.PathLike | None = None) -> str:
        """Write :meth:`plot` to ``filename`` and return the path written; for a matte, the cut-out
        instead (the image with the alpha as a fourth channel: RGBA, in PNG, WebP or TIFF).

        The default is ``<input stem>_pred.jpg`` (a matte: ``.png``) in the current directory. The
        format follows the suffix; parent directories are created; the file appears atomically
        (written to a temporary file in the same directory, then renamed), so readers never see a
        half-written image.
        """
        path = Path(filename) if filename is not None else Path(self._default_filename())
        fmt = Image.registered_extensions().get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"cannot save '{path}': unknown image format for suffix '{path.suffix}'")
        picture = self._picture_field()
        if picture is not None:   # restore: the restored picture itself (plot() shows it beside the input)
            return picture.save(path)
        cutout = self._cutout_field()
        if cutout is not None and fmt not in self.RGBA_FORMATS:
            raise ValueError(f"cannot save '{path}': a matte is saved as an RGBA cut-out, which {fmt} cannot "
                             f"hold; use .png, .webp or .tiff")
        image = Image.fromarray(cutout.rgba(self.orig_img)) if cutout is not None else Image.fromarray(self.plot())
        options = {"quality": 95} if fmt == "JPEG" else {}
        with atomic_write(path, what="save") as f:   # mode follows the umask like a normal file
            image.save(f, format=fmt, **options)
        return str(path)

    def show(self) -> bool:
        """Open the annotated image in the system's image viewer (``PIL.ImageShow``).

        Returns whether a viewer was started. Where none can be (a Linux/BSD machine with neither
        ``DISPLAY`` nor ``WAYLAND_DISPLAY`` set, as on servers and in containers, or no viewer
        installed) it logs one warning per process pointing to :meth:`save` instead of doing
        nothing silently.
        """
        problem = display_problem()
        if problem is None:
            if ImageShow.show(Image.fromarray(self.plot()), title=Path(self.path).name or None):
                return True
            problem = "no image viewer was found (PIL.ImageShow has none for this system)"
        _warn_cannot_show(problem)
        return False


def display_problem() -> str | None:
    """Why no window can open here, or None when a display may exist.

    X11/Wayland systems (Linux, the BSDs) need ``DISPLAY`` or ``WAYLAND_DISPLAY``; macOS and
    Windows always have a desktop session to try.
    """
    if os.name == "posix" and sys.platform != "darwin":
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            return "no display was found (DISPLAY and WAYLAND_DISPLAY are unset)"
    return None


def _warn_cannot_show(problem: str) -> None:
    global _warned_cannot_show
    if _warned_cannot_show:
        return
    _warned_cannot_show = True
    log.warning("Results.show() cannot open the image: %s; use r.save('out.jpg') to write the "
                "annotated image to a file instead (this warning is shown once)", problem)
