"""The promptable-segmentation result of one image and prompt: :class:`PromptMasks` (``Results.masks``)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ...results import load_font

__all__ = ["PromptMasks"]

#: overlay colour of the drawn mask, and the colours of foreground / background points and boxes
MASK_COLOR = (30, 144, 255)
POINT_COLORS = {1: (60, 200, 75), 0: (230, 57, 70)}
BOX_COLOR = (255, 200, 0)


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class PromptMasks:
    """The masks one prompt gives on one image.

    ``data``: (M, H, W) bool masks at the original image's resolution (M = 3 with
    ``multimask=True``, else 1), in the decoder's token order; ``scores``: (M,) predicted IoU of
    each mask. Both are torch tensors on the model's device as predict returns them (numpy after
    :meth:`numpy`). ``points`` (P, 2), ``labels`` (P,) and ``boxes`` (K, 4): the prompt, in the
    image's pixels (drawn by :meth:`plot_on`). ``best``: the index of the highest-scoring mask.

    ``logits``: (M, S/4, S/4) float32 low-resolution mask logits in the network's S x S frame,
    before the upsampling to the image (SAM's ``low_res_masks``), for the families that take mask
    prompts (SAM, SAM 2, EdgeTAM; None for the others): pass one back to refine it,
    ``model(points=..., mask_input=r.masks.logits[r.masks.best])``, as SAM's predictor iterates.
    """

    def __init__(self, data: torch.Tensor | np.ndarray, scores: torch.Tensor | np.ndarray,
                 points: np.ndarray | None = None, labels: np.ndarray | None = None,
                 boxes: np.ndarray | None = None, logits: torch.Tensor | np.ndarray | None = None):
        if not isinstance(data, (torch.Tensor, np.ndarray)) or not isinstance(scores, (torch.Tensor, np.ndarray)):
            raise TypeError("PromptMasks data and scores must be torch tensors or numpy arrays")
        if data.ndim != 3:
            raise ValueError(f"PromptMasks data must be (M, H, W) masks, got shape {tuple(data.shape)}")
        if tuple(scores.shape) != (data.shape[0],):
            raise ValueError(f"PromptMasks scores must be ({data.shape[0]},), one per mask, got {tuple(scores.shape)}")
        if logits is not None and (logits.ndim != 3 or logits.shape[0] != data.shape[0]):
            raise ValueError(f"PromptMasks logits must be ({data.shape[0]}, s, s), one per mask, got "
                             f"{tuple(logits.shape)}")
        self._data = data
        self._scores = scores
        self._logits = logits
        self.points = np.zeros((0, 2)) if points is None else np.asarray(points, dtype=np.float64).reshape(-1, 2)
        self.labels = np.zeros(0, np.int64) if labels is None else np.asarray(labels, dtype=np.int64).reshape(-1)
        self.boxes = np.zeros((0, 4)) if boxes is None else np.asarray(boxes, dtype=np.float64).reshape(-1, 4)

    # ---- fields --------------------------------------------------------------------------------
    @property
    def data(self) -> torch.Tensor | np.ndarray:
        """The (M, H, W) bool masks."""
        return self._data

    @property
    def scores(self) -> torch.Tensor | np.ndarray:
        """The (M,) predicted IoU per mask."""
        return self._scores

    @property
    def logits(self) -> torch.Tensor | np.ndarray | None:
        """The (M, S/4, S/4) low-resolution mask logits (None for a family without mask prompts)."""
        return self._logits

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self._data.shape)

    @property
    def orig_shape(self) -> tuple[int, int]:
        return self.shape[1], self.shape[2]

    def __len__(self) -> int:
        return int(self._data.shape[0])

    @property
    def best(self) -> int:
        """Index of the mask with the highest predicted IoU (the first of equals)."""
        return int(np.argmax(_np(self._scores).astype(np.float64)))

    # ---- conversions ---------------------------------------------------------------------------
    def _with(self, data, scores, logits=None) -> PromptMasks:
        return PromptMasks(data, scores, self.points, self.labels, self.boxes, logits)

    def _logits_as(self, conv):
        return None if self._logits is None else conv(self._logits)

    def cpu(self) -> PromptMasks:
        conv = (lambda t: t.cpu() if isinstance(t, torch.Tensor) else t)
        return self._with(conv(self._data), conv(self._scores), self._logits_as(conv))

    def numpy(self) -> PromptMasks:
        return self._with(_np(self._data), _np(self._scores), self._logits_as(_np))

    def to(self, *args: Any, **kwargs: Any) -> PromptMasks:
        """Move/cast masks, scores (and logits) like ``torch.Tensor.to`` (numpy data becomes tensors first)."""
        conv = (lambda t: (torch.from_numpy(np.ascontiguousarray(t)) if isinstance(t, np.ndarray) else t)
                .to(*args, **kwargs))
        return self._with(conv(self._data), conv(self._scores), self._logits_as(conv))

    def __repr__(self) -> str:
        where = f"tensor on {self._data.device}" if isinstance(self._data, torch.Tensor) else "numpy"
        return (f"PromptMasks(masks={len(self)}, shape={self.orig_shape}, scores={np.round(_np(self._scores), 4)}, "
                f"points={len(self.points)}, boxes={len(self.boxes)}, {where})")

    # ---- user-facing outputs -------------------------------------------------------------------
    def summary(self, names: dict[int, str] | None = None, decimals: int = 5) -> list[dict[str, Any]]:
        """One dict per mask, in token order: name (``mask<i>``), index, confidence (the predicted
        IoU), area (fraction of the image) and the mask's bounding box (None for an empty mask)."""
        masks, scores = _np(self._data).astype(bool), _np(self._scores).astype(np.float64)
        out = []
        for i, m in enumerate(masks):
            ys, xs = np.nonzero(m.any(1))[0], np.nonzero(m.any(0))[0]
            box = None if not len(ys) else {"x1": int(xs[0]), "y1": int(ys[0]), "x2": int(xs[-1]) + 1,
                                            "y2": int(ys[-1]) + 1}
            out.append({"name": f"mask{i}", "index": i, "confidence": round(float(scores[i]), decimals),
                        "area": round(float(m.mean()) if m.size else 0.0, decimals), "box": box})
        return out

    def plot_on(self, image: np.ndarray, names: dict[int, str] | None = None, alpha: float = 0.5,
                index: int | None = None) -> np.ndarray:
        """``image`` (HxWx3 uint8 RGB, the masks' size) with mask ``index`` (default :attr:`best`)
        blended in, its score in the top-left corner, and the prompt drawn: foreground points
        green, background points red (white rims), boxes yellow."""
        if tuple(image.shape[:2]) != self.orig_shape:
            raise ValueError(f"image of shape {tuple(image.shape)} does not match the masks {self.orig_shape}")
        h, w = self.orig_shape
        out = image.copy()
        if len(self):
            i = self.best if index is None else int(index)
            m = _np(self._data[i]).astype(bool)
            color = np.array(MASK_COLOR, dtype=np.float32)
            out[m] = np.clip(np.rint(out[m].astype(np.float32) * (1 - alpha) + color * alpha), 0, 255).astype(np.uint8)
        pil = Image.fromarray(out)
        draw = ImageDraw.Draw(pil)
        lw = max(2, round((h + w) / 2 * 0.004))
        for x1, y1, x2, y2 in self.boxes:
            draw.rectangle((x1, y1, x2, y2), outline=BOX_COLOR, width=lw)
        r = max(3, round((h + w) / 2 * 0.01))
        for (x, y), lab in zip(self.points, self.labels):
            draw.ellipse((x - r, y - r, x + r, y + r), fill=POINT_COLORS.get(int(lab), (200, 200, 200)),
                         outline=(255, 255, 255), width=max(1, r // 3))
        if len(self):
            font = load_font(max(10, round((h + w) / 2 * 0.03)))
            text = f"mask{i} {float(_np(self._scores)[i]):.2f}"
            tw, th = draw.textlength(text, font=font), font.getbbox("Agy|")[3]
            draw.rectangle((0, 0, tw + 6, th + 6), fill=(20, 20, 20))
            draw.text((3, 3), text, fill=(255, 255, 255), font=font)
        return np.array(pil, dtype=np.uint8)
