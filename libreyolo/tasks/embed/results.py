"""Embedding results: :class:`Embedding`, the ``embedding`` field of a :class:`~libreyolo.results.Results`."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["Embedding"]


class Embedding:
    """One image's embedding: ``data``, a (D,) float32 vector, L2-normalized (a torch tensor, or a
    numpy array after :meth:`numpy`). Its dot product with another image's embedding, or with a
    text embedding of the same model (``model.embed_text``), is their cosine similarity."""

    def __init__(self, data: torch.Tensor | np.ndarray):
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise TypeError(f"Embedding data must be a torch tensor or numpy array, got {type(data).__name__}")
        if data.ndim != 1 or data.shape[0] < 1:
            raise ValueError(f"Embedding data must have shape (D,), got {tuple(data.shape)}")
        self._data = data

    @property
    def data(self) -> torch.Tensor | np.ndarray:
        return self._data

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    def __len__(self) -> int:
        return int(self._data.shape[0])

    def _map(self, fn) -> Embedding:
        return Embedding(fn(self._data))

    def cpu(self) -> Embedding:
        return self._map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t)

    def numpy(self) -> Embedding:
        return self._map(lambda t: t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t)

    def to(self, *args: Any, **kwargs: Any) -> Embedding:
        def conv(t):
            if isinstance(t, np.ndarray):
                t = torch.from_numpy(np.ascontiguousarray(t))
            return t.to(*args, **kwargs)
        return self._map(conv)

    def tolist(self) -> list[float]:
        d = self._data
        return (d.detach().cpu().tolist() if isinstance(d, torch.Tensor) else d.tolist())

    def __repr__(self) -> str:
        where = f"tensor on {self._data.device}" if isinstance(self._data, torch.Tensor) else "numpy"
        return f"Embedding(dim={len(self)}, {where})"

    def summary(self, names: dict[int, str], decimals: int = 5) -> dict:
        """``{"dim": D, "embedding": [...]}`` (Python floats; what ``to_json`` and the CLI's json= write)."""
        return {"dim": len(self), "embedding": [round(float(v), decimals) for v in self.tolist()]}

    def plot_on(self, image: np.ndarray, names: dict[int, str]) -> np.ndarray:
        """``image`` with one line at its top-left corner: the embedding's width."""
        from PIL import Image, ImageDraw

        from ...results import load_font
        h, w = image.shape[:2]
        fs = max(10, round(min(h, w) * 0.045))
        font = load_font(fs)
        text = f"embedding ({len(self)}-d)"
        pad = max(2, fs // 3)
        base = Image.fromarray(image).convert("RGBA")
        overlay = Image.new("RGBA", base.size, (0, 0, 0, 0))
        draw = ImageDraw.Draw(overlay)
        tw = draw.textlength(text, font=font)
        draw.rectangle((0, 0, min(w, tw + 2 * pad) - 1, min(h, font.getbbox("Agy|")[3] + 2 * pad) - 1),
                       fill=(0, 0, 0, 170))
        draw.text((pad, pad), text, fill=(255, 255, 255, 255), font=font)
        return np.array(Image.alpha_composite(base, overlay).convert("RGB"), dtype=np.uint8)
