"""Classification results: :class:`Probs`, the ``probs`` field of a :class:`~libreyolo.results.Results`."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

__all__ = ["Probs"]


class Probs:
    """Class probabilities of one image and its top classes.

    ``data`` is the (nc,) softmax of the logits (a torch tensor, or a numpy array after
    :meth:`numpy`). The top classes come from the predict stage (softmax and top-k run on the
    device, inside the captured stage) or, when not given, from ``data``; they are sorted by
    probability, highest first.

    * ``top1`` (int) and ``top5`` (list of int): class indices (``top5`` holds fewer when the
      model has fewer classes or predict ran with ``topk`` < 5);
    * ``top1conf`` (0-d) and ``top5conf`` (1-d): their probabilities, of ``data``'s kind (tensor or
      numpy array; ``float(p.top1conf)`` for a Python number);
    * ``top`` / ``topconf``: all the top-k classes predict computed (``topk``, default 5).
    """

    def __init__(self, data: torch.Tensor | np.ndarray, top: list[int] | None = None,
                 topconf: torch.Tensor | np.ndarray | None = None):
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise TypeError(f"Probs data must be a torch tensor or numpy array, got {type(data).__name__}")
        if data.ndim != 1 or data.shape[0] < 1:
            raise ValueError(f"Probs data must have shape (nc,), got {tuple(data.shape)}")
        if top is None:
            k = min(5, int(data.shape[0]))
            order = (torch.argsort(data, descending=True, stable=True)[:k].tolist() if isinstance(data, torch.Tensor)
                     else np.argsort(-data, kind="stable")[:k].tolist())
            top, topconf = order, data[order]
        if topconf is None or len(topconf) != len(top):
            raise ValueError("Probs: top and topconf must be given together, one confidence per class")
        self._data = data
        self._top = [int(c) for c in top]
        self._topconf = topconf

    # ---- fields --------------------------------------------------------------------------------
    @property
    def data(self) -> torch.Tensor | np.ndarray:
        """(nc,) class probabilities (summing to 1)."""
        return self._data

    @property
    def top(self) -> list[int]:
        """The top-k class indices, most probable first."""
        return list(self._top)

    @property
    def topconf(self) -> torch.Tensor | np.ndarray:
        """The probabilities of :attr:`top`."""
        return self._topconf

    @property
    def top1(self) -> int:
        return self._top[0]

    @property
    def top5(self) -> list[int]:
        return self._top[:5]

    @property
    def top1conf(self) -> torch.Tensor | np.ndarray:
        return self._topconf[0]

    @property
    def top5conf(self) -> torch.Tensor | np.ndarray:
        return self._topconf[:5]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    def __len__(self) -> int:
        return int(self._data.shape[0])

    # ---- conversions ---------------------------------------------------------------------------
    def _map(self, fn) -> Probs:
        return Probs(fn(self._data), self._top, fn(self._topconf))

    def cpu(self) -> Probs:
        """The same probabilities with tensor data on the CPU (numpy data is returned as is)."""
        return self._map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t)

    def numpy(self) -> Probs:
        """The same probabilities as numpy arrays."""
        return self._map(lambda t: t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t)

    def to(self, *args: Any, **kwargs: Any) -> Probs:
        """Move/cast like ``torch.Tensor.to`` (numpy data becomes a tensor first)."""
        def conv(t):
            if isinstance(t, np.ndarray):
                t = torch.from_numpy(np.ascontiguousarray(t))
            return t.to(*args, **kwargs)
        return self._map(conv)

    def __repr__(self) -> str:
        where = f"tensor on {self._data.device}" if isinstance(self._data, torch.Tensor) else "numpy"
        confs = ", ".join(f"{float(c):.4f}" for c in self._topconf)
        return f"Probs(nc={len(self)}, {where}, top={self._top}, topconf=[{confs}])"

    # ---- user-facing outputs -------------------------------------------------------------------
    def _name(self, names: dict[int, str], cls: int) -> str:
        return names.get(cls, str(cls))

    def summary(self, names: dict[int, str], decimals: int = 5) -> list[dict]:
        """One dict per top class, most probable first: name, class, confidence (Python numbers)."""
        return [{"name": self._name(names, c), "class": c, "confidence": round(float(p), decimals)}
                for c, p in zip(self._top, self._topconf)]

    def plot_on(self, image: np.ndarray, names: dict[int, str]) -> np.ndarray:
        """``image`` (HxWx3 uint8 RGB) with the top classes listed at its top-left corner:
        one ``name 0.87`` line each, white on a translucent dark box, sized to the image."""
        from ...results import load_font
        h, w = image.shape[:2]
        fs = max(10, round(min(h, w) * 0.045))
        font = load_font(fs)
        lines = [f"{self._name(names, c)} {float(p):.2f}" for c, p in zip(self._top, self._topconf)]
        pad = max(2, fs // 3)
        probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
        line_h = font.getbbox("Agy|")[3] + pad // 2
        box_w = int(max(probe.textlength(t, font=font) for t in lines)) + 2 * pad
        box_h = line_h * len(lines) + 2 * pad - pad // 2
        base = Image.fromarray(image).convert("RGBA")
        overlay = Image.new("RGBA", base.size, (0, 0, 0, 0))
        draw = ImageDraw.Draw(overlay)
        draw.rectangle((0, 0, min(w, box_w) - 1, min(h, box_h) - 1), fill=(0, 0, 0, 170))
        for i, text in enumerate(lines):
            draw.text((pad, pad + i * line_h), text, fill=(255, 255, 255, 255), font=font)
        return np.array(Image.alpha_composite(base, overlay).convert("RGB"), dtype=np.uint8)
