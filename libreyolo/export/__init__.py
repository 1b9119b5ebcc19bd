"""Exporting models to other runtimes, and running what was exported.

``model.export(format="onnx", ...)`` (:func:`export_model`) writes an ONNX graph that ends in the
task's final outputs (detections, top-k classes, a class map) with the model's metadata in its
``metadata_props``; ``LibreYOLO("model.onnx")`` loads such a file as an
:class:`~libreyolo.export.onnx_model.OnnxModel`, which runs it through onnxruntime behind the same
predict API and Results. ``format="openvino"`` converts that graph to an OpenVINO IR directory,
which ``LibreYOLO(dir)`` loads as an :class:`~libreyolo.export.openvino_model.OpenvinoModel`
(OpenVINO's CPU plugin). Depth, matte, OCR and promptable segmentation export too; OCR and
promptable segmentation as two graphs (:mod:`libreyolo.export.twostage`). See docs/export.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

#: the formats ``model.export`` writes
FORMATS = ("onnx", "torchscript", "openvino", "engine")
#: the formats with int8 post-training quantization (``int8=True, data=...``)
INT8_FORMATS = ("openvino", "engine")


def export_model(model: Any, format: str = "onnx", **kwargs: Any) -> Path:
    """Export ``model`` (a :class:`~libreyolo.models.base.Model`) to ``format``; returns the file written.

    ``kwargs`` are the format's options (ONNX: :func:`libreyolo.export.onnx.export_onnx`;
    TorchScript, the traced network only: :func:`libreyolo.export.torchscript.export_torchscript`;
    OpenVINO: :func:`libreyolo.export.openvino.export_openvino`, the ONNX options).
    """
    fmt = str(format).strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {', '.join(FORMATS)}, got {format!r}")
    if fmt not in INT8_FORMATS and ("int8" in kwargs or "data" in kwargs):
        raise ValueError(f"int8 and data= (int8 calibration) are options of the {' and '.join(INT8_FORMATS)} "
                         f"export, not of format={fmt!r}")
    if fmt == "torchscript":
        other = sorted(set(kwargs) - {"file", "imgsz", "batch"})
        if other:
            raise ValueError(f"{', '.join(other)}: options of the ONNX export; the TorchScript export (the traced "
                             "network) takes file, imgsz and batch")
        from .torchscript import export_torchscript
        return export_torchscript(model, **kwargs)
    if fmt == "engine":   # a TensorRT engine built from the ONNX graph (needs CUDA and tensorrt)
        from .tensorrt import export_engine
        return export_engine(model, **kwargs)
    if fmt == "openvino":   # the ONNX graph, converted by OpenVINO's ONNX frontend
        from .openvino import export_openvino
        return export_openvino(model, **kwargs)
    from .onnx import export_onnx
    return export_onnx(model, **kwargs)
