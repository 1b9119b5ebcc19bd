"""``LibreYOLO("<name>_openvino_model")``: an OpenVINO export run on OpenVINO's CPU plugin behind the predict API.

:class:`OpenvinoModel` is :class:`~libreyolo.export.onnx_model.OnnxModel` with an OpenVINO compiled
model in place of the onnxruntime session: the same metadata (read from the IR's ``rt_info``, where
the ONNX frontend put the ONNX file's ``metadata_props``), the same resize on the host, the same
graph inputs and outputs, the same host-side stage of each task and the same Results and errors.
The CPU plugin is compiled with ``INFERENCE_PRECISION_HINT=f32``: on CPUs with bfloat16 or AMX
units its default is bfloat16, which would not reproduce eager predict.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .onnx import META_FORMAT
from .onnx_model import OnnxModel
from .openvino import RT_SECTION, find_xml, require_openvino

BACKEND = "openvino"


def _cpu_only(device: Any) -> torch.device:
    text = "auto" if device is None else str(device).strip().lower()
    if text in ("auto", "cpu"):
        return torch.device("cpu")
    if text.isdigit() or text == "cuda" or text.startswith("cuda:"):
        raise ValueError(f"device {device!r}: OpenVINO models run on OpenVINO's CPU plugin here; use device='cpu' "
                         "(or the .onnx export with onnxruntime-gpu, or the .pt checkpoint, for a GPU)")
    raise ValueError(f"device must be 'auto' or 'cpu' for an OpenVINO model, got {device!r}")


def read_ir_metadata(ir) -> dict[str, str]:
    """The exporter's metadata (strings) from an OpenVINO model's ``rt_info``."""
    if not ir.has_rt_info([RT_SECTION]):
        return {}
    section = ir.get_rt_info()[RT_SECTION]
    return {str(k): v.astype(str) for k, v in section.items()}


class OpenvinoModel(OnnxModel):
    """An OpenVINO IR written by ``model.export(format="openvino")`` (its directory or its ``.xml``),
    with ``Model``'s predict API. ``device``: 'auto' or 'cpu'. ``threads``: the CPU plugin's
    inference threads (default ``torch.get_num_threads()``, as :class:`OnnxModel`)."""

    BACKEND = BACKEND
    KIND = "OpenVINO"

    def __init__(self, path: str | os.PathLike, device: Any = "auto", *, threads: int | None = None):
        ov = require_openvino()
        self.path = find_xml(path)
        self._core = ov.Core()
        try:
            self._ir = self._core.read_model(str(self.path))
        except Exception as exc:   # a truncated or foreign xml, weights that do not match it
            text = " ".join(str(exc).split())[:300]
            raise ValueError(f"cannot load OpenVINO model '{self.path}': not a readable OpenVINO IR, the files are "
                             f"corrupt or truncated ({type(exc).__name__}: {text}); export it again") from exc
        meta = read_ir_metadata(self._ir)
        if meta.get(META_FORMAT) is None:
            raise ValueError(f"{self.path} is an OpenVINO model but not a libreyolo export (its rt_info has no "
                             f"'{RT_SECTION}/{META_FORMAT}' entry); export it with model.export(format='openvino')")
        self._init_meta(meta, threads)
        self.to(device)

    def to(self, device: Any) -> OpenvinoModel:
        """(Re)compile for the CPU plugin (the only device this loader runs on)."""
        self.device = _cpu_only(device)
        config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_NUM_THREADS": int(self.threads or torch.get_num_threads())}
        self.compiled = self._core.compile_model(self._ir, "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.providers = ["CPU"]
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        self.output_names = [o.get_any_name() for o in self.compiled.outputs]
        return self

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        # share_outputs=False: copies, since the next inference reuses the request's output buffers
        out = self.request.infer(feeds, share_inputs=False, share_outputs=False)
        return [out[o] for o in self.compiled.outputs]

    def fuse(self) -> OpenvinoModel:
        return self   # OpenVINO fuses BatchNorm into convolutions when it compiles the model

    def __repr__(self) -> str:
        shape = "dynamic" if self.dynamic else f"batch {self.batch}, {self.imgsz}x{self.imgsz}"
        return (f"OpenvinoModel({self.FAMILY}-{self.size}, task={self.TASK}, nc={self.nc}, {shape}, CPU, "
                f"file={self.path})")

    @property
    def directory(self) -> Path:
        """The export directory (the ``.xml``'s)."""
        return self.path.parent
