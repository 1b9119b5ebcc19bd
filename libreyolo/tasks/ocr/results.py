"""The OCR result of one image: :class:`TextLines` (``Results.texts``)."""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from ...results import class_color, load_font

__all__ = ["TextLines"]

log = logging.getLogger(__name__)

#: fonts tried, in order, for drawing recognised text (CJK-capable ones first); PIL's own font
#: (Latin only: other scripts show as boxes) when none is installed
_FONT_CANDIDATES = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/noto-cjk/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/System/Library/Fonts/PingFang.ttc",
    "C:/Windows/Fonts/msyh.ttc",
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
)


@functools.lru_cache(maxsize=16)
def text_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """The first installed font of :data:`_FONT_CANDIDATES` at ``size`` px, else PIL's default."""
    for path in _FONT_CANDIDATES:
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            continue
    log.debug("no CJK-capable font found; OCR text is drawn with PIL's default font")
    return load_font(size)


class TextLines:
    """The text lines found in one image, in reading order.

    ``polygons``: (n, 4, 2) float32 corners (top-left, top-right, bottom-right, bottom-left) in
    original-image pixels; ``texts``: n strings; ``conf``: (n,) recognition confidence (the mean
    probability of the decoded characters); ``det_conf``: (n,) detection score (the mean text
    probability inside the box). ``data`` packs them as one (n, 10) float tensor
    ``[x1, y1, ..., x4, y4, conf, det_conf]``. An image without text gives n = 0.
    """

    def __init__(self, polygons: torch.Tensor | np.ndarray, texts: list[str], conf: torch.Tensor | np.ndarray,
                 det_conf: torch.Tensor | np.ndarray):
        n = len(texts)
        if tuple(polygons.shape) != (n, 4, 2):
            raise ValueError(f"TextLines polygons must have shape ({n}, 4, 2) for {n} texts, got {tuple(polygons.shape)}")
        if tuple(conf.shape) != (n,) or tuple(det_conf.shape) != (n,):
            raise ValueError(f"TextLines conf and det_conf must have shape ({n},), got {tuple(conf.shape)} "
                             f"and {tuple(det_conf.shape)}")
        self.polygons = polygons
        self.texts = [str(t) for t in texts]
        self.conf = conf
        self.det_conf = det_conf

    def __len__(self) -> int:
        return len(self.texts)

    def __iter__(self) -> Iterator[tuple[Any, str, float]]:
        """(polygon, text, confidence) per line."""
        for i, t in enumerate(self.texts):
            yield self.polygons[i], t, float(self.conf[i])

    def __getitem__(self, index: Any) -> TextLines:
        idx = np.arange(len(self))[index]
        idx = np.atleast_1d(idx)
        sel = (lambda a: a[torch.as_tensor(idx, dtype=torch.long)]) if isinstance(self.polygons, torch.Tensor) \
            else (lambda a: a[idx])
        return TextLines(sel(self.polygons), [self.texts[int(i)] for i in idx], sel(self.conf), sel(self.det_conf))

    @property
    def data(self) -> torch.Tensor | np.ndarray:
        """(n, 10): the 8 corner coordinates, conf, det_conf."""
        p, c, d = self.polygons, self.conf, self.det_conf
        if isinstance(p, torch.Tensor):
            return torch.cat((p.reshape(-1, 8), torch.as_tensor(c).reshape(-1, 1).to(p),
                              torch.as_tensor(d).reshape(-1, 1).to(p)), 1)
        return np.concatenate((p.reshape(-1, 8), np.asarray(c).reshape(-1, 1), np.asarray(d).reshape(-1, 1)), 1)

    @property
    def text(self) -> str:
        """All lines joined by newlines, in reading order."""
        return "\n".join(self.texts)

    # ---- conversions ---------------------------------------------------------------------------
    def _map(self, fn) -> TextLines:
        return TextLines(fn(self.polygons), list(self.texts), fn(self.conf), fn(self.det_conf))

    def cpu(self) -> TextLines:
        return self._map(lambda a: a.cpu() if isinstance(a, torch.Tensor) else a)

    def numpy(self) -> TextLines:
        return self._map(lambda a: a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a))

    def to(self, *args: Any, **kwargs: Any) -> TextLines:
        return self._map(lambda a: (a if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a)))
                         .to(*args, **kwargs))

    def __repr__(self) -> str:
        shown = ", ".join(repr(t) for t in self.texts[:3]) + (", ..." if len(self) > 3 else "")
        return f"TextLines(n={len(self)}, texts=[{shown}])"

    # ---- user-facing outputs -------------------------------------------------------------------
    def _host(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h = self.numpy()
        return (np.asarray(h.polygons, np.float64), np.asarray(h.conf, np.float64),
                np.asarray(h.det_conf, np.float64))

    def summary(self, names: dict[int, str], decimals: int = 5) -> list[dict[str, Any]]:
        """One dict per line, in reading order: text, confidence, det_confidence, polygon [[x, y] x 4]."""
        polys, conf, det = self._host()
        return [{"text": t, "confidence": round(float(c), decimals), "det_confidence": round(float(d), decimals),
                 "polygon": [[round(float(x), decimals), round(float(y), decimals)] for x, y in p]}
                for t, p, c, d in zip(self.texts, polys, conf, det)]

    def plot_on(self, image: np.ndarray, names: dict[int, str], line_width: int | None = None) -> np.ndarray:
        """``image`` (HxWx3 uint8 RGB) with each line's polygon outlined and its text (and
        confidence) on a filled tag above the polygon's top-left corner."""
        polys, conf, _ = self._host()
        h, w = image.shape[:2]
        lw = int(line_width) if line_width is not None else max(1, round((h + w) / 2 * 0.002))
        pil = Image.fromarray(image)
        draw = ImageDraw.Draw(pil)
        for i, (poly, text) in enumerate(zip(polys, self.texts)):
            color = class_color(i)
            pts = [(float(x), float(y)) for x, y in poly]
            draw.line(pts + pts[:1], fill=color, width=lw)
            side = float(np.linalg.norm(poly[0] - poly[3]))   # the line's height sets the label's size
            font = text_font(max(10, min(48, int(round(side * 0.7)))))
            label = f"{text} {conf[i]:.2f}"
            x0, y0 = pts[0]
            bbox = draw.textbbox((0, 0), label, font=font)
            tw, th = bbox[2] - bbox[0], bbox[3] - bbox[1]
            tx = min(max(0.0, x0), max(0.0, w - tw - 4))
            ty = y0 - th - 4 if y0 - th - 4 >= 0 else min(h - th - 4, y0 + side)
            draw.rectangle((tx, ty, tx + tw + 3, ty + th + 3), fill=color)
            lum = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2]
            draw.text((tx + 2 - bbox[0], ty + 2 - bbox[1]), label, fill=(0, 0, 0) if lum > 150 else (255, 255, 255),
                      font=font)
        return np.array(pil, dtype=np.uint8)
