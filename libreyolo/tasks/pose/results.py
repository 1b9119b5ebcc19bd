"""Keypoints of one image's instances (the pose task's Results field)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ...results import DataRows

#: COCO's 17 person keypoints (the default names, skeleton and flip order of pose datasets)
COCO_KEYPOINT_NAMES = ("nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder",
                       "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip",
                       "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle")
#: COCO's limbs as pairs of 0-based keypoint indices
COCO_SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
                 (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))
#: the index each COCO keypoint takes in a horizontally flipped image (left <-> right)
COCO_FLIP_IDX = (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15)
#: COCO's per-keypoint OKS sigmas
COCO_SIGMAS = (0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072, 0.062, 0.062, 0.107, 0.107,
               0.087, 0.087, 0.089, 0.089)


def default_skeleton(num_keypoints: int) -> tuple[tuple[int, int], ...]:
    """COCO's skeleton for 17 keypoints; none (points only) for another count."""
    return COCO_SKELETON if num_keypoints == 17 else ()


class Keypoints(DataRows):
    """Keypoints of one image: ``data`` is (n, K, 3) ``x, y, conf`` in original-image pixels, one
    row of K keypoints per instance (in the order of the image's boxes).

    ``orig_shape`` is the (height, width) of the image; ``skeleton`` the limbs drawn by
    :meth:`plot_on` as pairs of keypoint indices (COCO's for 17 keypoints by default).
    """

    def __init__(self, data: torch.Tensor | np.ndarray, orig_shape: tuple[int, int],
                 skeleton: Any = None):
        if not isinstance(data, (torch.Tensor, np.ndarray)):
            raise TypeError(f"Keypoints data must be a torch tensor or numpy array, got {type(data).__name__}")
        if data.ndim != 3 or data.shape[2] != 3:
            raise ValueError(f"Keypoints data must have shape (n, K, 3) = x, y, conf; got {tuple(data.shape)}")
        self._data = data
        self.orig_shape = (int(orig_shape[0]), int(orig_shape[1]))
        self.skeleton = tuple(tuple(int(i) for i in pair) for pair in
                              (default_skeleton(int(data.shape[1])) if skeleton is None else skeleton))

    @property
    def data(self) -> torch.Tensor | np.ndarray:
        """The (n, K, 3) array: x, y, conf."""
        return self._data

    @property
    def xy(self) -> torch.Tensor | np.ndarray:
        """(n, K, 2) keypoint coordinates in pixels."""
        return self._data[..., :2]

    @property
    def xyn(self) -> torch.Tensor | np.ndarray:
        """(n, K, 2) keypoint coordinates divided by the image width / height."""
        h, w = self.orig_shape
        xy = self._data[..., :2]
        scale = torch.tensor([w, h], dtype=xy.dtype, device=xy.device) if isinstance(xy, torch.Tensor) \
            else np.array([w, h], dtype=xy.dtype)
        return xy / scale

    @property
    def conf(self) -> torch.Tensor | np.ndarray:
        """(n, K) keypoint confidences."""
        return self._data[..., 2]

    def __getitem__(self, index: Any) -> Keypoints:
        data = self._data[index]
        if data.ndim == 2:
            data = data[None]
        return Keypoints(data, self.orig_shape, self.skeleton)

    def __repr__(self) -> str:
        return f"Keypoints(n={len(self)}, keypoints={self._data.shape[1]}, orig_shape={self.orig_shape})"

    def _new(self, data: Any) -> Keypoints:
        return Keypoints(data, self.orig_shape, self.skeleton)

    def _rows(self) -> np.ndarray:
        d = self._data
        if isinstance(d, torch.Tensor):
            d = d.detach().float().cpu().numpy()
        return np.asarray(d, dtype=np.float64)

    def instance_summary(self, i: int, normalize: bool, decimals: int) -> list[dict]:
        """Instance ``i``'s keypoints as plain numbers (``x``, ``y``, ``conf``)."""
        h, w = self.orig_shape
        out = []
        for x, y, c in self._rows()[i]:
            if normalize:
                x, y = x / w, y / h
            out.append({"x": round(float(x), decimals), "y": round(float(y), decimals),
                        "conf": round(float(c), decimals)})
        return out

    def summary(self, names: dict[int, str], decimals: int = 5) -> list[list[dict]]:
        return [self.instance_summary(i, False, decimals) for i in range(len(self))]

    #: keypoints whose confidence is below this are not drawn
    PLOT_CONF = 0.5

    def plot_on(self, image: np.ndarray, names: dict[int, str]) -> np.ndarray:
        """The skeleton's limbs and the keypoints drawn on a copy of ``image`` (HxWx3 uint8)."""
        from ...results import class_color
        h, w = image.shape[:2]
        radius = max(2, round((h + w) / 2 * 0.004))
        pil = Image.fromarray(image)
        draw = ImageDraw.Draw(pil)
        for inst in self._rows():
            seen = (inst[:, 2] >= self.PLOT_CONF) & np.isfinite(inst[:, :2]).all(1) \
                & (inst[:, 0] >= 0) & (inst[:, 0] < w) & (inst[:, 1] >= 0) & (inst[:, 1] < h)
            for n, (a, b) in enumerate(self.skeleton):
                if a < len(inst) and b < len(inst) and seen[a] and seen[b]:
                    draw.line([(inst[a, 0], inst[a, 1]), (inst[b, 0], inst[b, 1])], fill=class_color(n),
                              width=max(1, radius // 2 + 1))
            for k, (x, y, _) in enumerate(inst):
                if seen[k]:
                    draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=class_color(k + 7))
        return np.array(pil, dtype=np.uint8)
