"""``LibreYOLO("nafnet.onnx")``: a restore export run through onnxruntime behind predict.

The restore export (:mod:`libreyolo.tasks.restore.export`) is the network on one batch of tiles:
``images`` (B, 3, S, S) RGB in [0, 1] -> ``restored`` (B, 3, scale*S, scale*S), clamped to
[0, 1], and ``unclamped``, the same before the clamp. :class:`OnnxRestoreModel` puts the restore
task's own tiling and blending around its session:
:meth:`~libreyolo.tasks.restore.task.RestorePlan.restore` cuts each image into tiles of ``imgsz``
(reflect-padded when smaller, ``tile_overlap`` pixels of overlap, ``tile_batch`` tiles a forward,
the last batch filled up), hands each batch to :class:`_TileStage` - the family's preprocessing of
the uint8 tiles (as eager predict's stage) and one session run - and blends the outputs with its
linear-ramp window, clamps and rounds; the task's ``RestorePlan.results`` makes ``Results.image``.

The blend reads ``unclamped``, as eager predict blends the network's outputs and clamps the
picture once, so the pictures are eager's up to onnxruntime's float rounding (a pixel at a .5
boundary may round to the next level; tests/unit/test_restore_onnx.py). A file exported before
that output existed has ``restored`` alone: it is blended from the clamped tiles, which differs
from eager where overlapping tiles disagree across 0 or 1.

A static export fixes the tile (``imgsz``) and ``tile_batch`` (the graph's batch); a dynamic one
(Real-ESRGAN) takes any. ``batch`` (images per chunk) does not change the pictures: each image is
tiled on its own.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .onnx_model import OnnxModel


class _TileStage:
    """The predictor's ``run_batch`` as ``RestorePlan.restore`` calls it: a batch of uint8 (t, t, 3)
    tiles -> the graph's (k, 3, s*t, s*t) float32 outputs, through ``model``'s session."""

    def __init__(self, model: OnnxRestoreModel):
        self.model = model
        names = model.output_names
        self.output = names.index("unclamped") if "unclamped" in names else names.index("restored")

    def run_batch(self, images, size: int, mode: Any, amp_dtype: Any, plan: Any, repeating: bool = False,
                  half: Any = None, stacked: torch.Tensor | None = None) -> torch.Tensor:
        u8 = stacked if stacked is not None else torch.stack(list(images))
        x = self.model.preprocess(u8, size)   # the eager stage's preprocessing (tiles are already imgsz)
        out = self.model.session.run(None, {"images": x.numpy().astype(np.float32)})
        return torch.from_numpy(out[self.output])


class OnnxRestoreModel(OnnxModel):
    """A restore export with the PyTorch model's predict (``Results.image``); see the module docstring."""

    TILES_RESTORE = True

    def __init__(self, path: str | Path, device: Any = "auto", *, threads: int | None = None):
        super().__init__(path, device, threads=threads)
        self.scale = int(self.meta.get("scale", 1))
        self._stage = _TileStage(self)

    #: LibreYOLO 1.6.0's name of :attr:`scale`
    @property
    def restore_scale(self) -> int:
        return self.scale

    def predict(self, source: Any, *, batch: int | None = None, tile_batch: Any = None, **kwargs: Any) -> Any:
        """As the restore model's predict (``tile_overlap``, ``tile_batch``; the pictures as
        ``Results.image``). A static export's ``tile_batch`` is its batch, its tile ``imgsz``."""
        from ..options import check_int
        from ..tasks.restore.task import TILE_BATCH
        if tile_batch is None:
            tile_batch = TILE_BATCH if self.dynamic else self.batch
        tile_batch = check_int("tile_batch", tile_batch, 1)
        if not self.dynamic and tile_batch != self.batch:
            raise ValueError(f"tile_batch={tile_batch}, but {self.path.name} was exported with batch={self.batch} "
                             f"(static: the tiles per forward); predict with tile_batch={self.batch}, or export "
                             f"again with batch={tile_batch}")
        if batch is not None:
            check_int("batch", batch, 1)
        # images go through the tiles one at a time: the chunk size changes nothing
        return super().predict(source, batch=self.batch if not self.dynamic else (batch or 1),
                               tile_batch=tile_batch, **kwargs)

    __call__ = predict

    def _task_feeds(self, plan, task_opts: dict) -> dict[str, Any]:
        return {"plan": plan}   # read by _run: the tiling of this call

    def _inputs(self, chunk, size: int, batch: int) -> list[torch.Tensor]:
        return [torch.as_tensor(np.ascontiguousarray(it.image)) for it in chunk]   # uint8 (H, W, 3), as decoded

    def _run(self, feeds: dict[str, Any]) -> list[Any]:
        plan, images = feeds["plan"], feeds["images"]
        size = plan.tile
        return [[plan.restore(self._stage, im, size, False, None, None) for im in images]]

    def _results(self, plan, out: dict[str, Any], chunk, size: int, speed: dict) -> list:
        return plan.results(out["restored"], chunk, size, speed)
