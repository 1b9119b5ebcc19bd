"""``model.export(format="openvino")``: the ONNX export's graph as an OpenVINO IR model (xml + bin).

The graph is the one :func:`libreyolo.export.onnx.export_onnx` writes (the network plus the task's
post-processing, detection NMS as ONNX ``NonMaxSuppression``, which OpenVINO's ONNX frontend
reads as its own ``NonMaxSuppression``), read by OpenVINO's ONNX frontend (``Core.read_model``)
and saved with ``openvino.save_model`` in float32 (``compress_to_fp16=False``: OpenVINO's default
would store the weights in float16). The ONNX file's ``metadata_props`` travel as the IR's
``rt_info`` under ``framework`` (the ONNX frontend copies them), so the ``.xml`` alone says what the
model is. :class:`~libreyolo.export.openvino_model.OpenvinoModel` runs the result behind the
predict API (``LibreYOLO("<name>_openvino_model")``).

The output is a directory, ``<stem>_openvino_model/`` next to the checkpoint (or here), holding
``<stem>.xml`` and ``<stem>.bin``; both are written to a temporary directory beside it first and
moved in with ``os.replace``.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: what the export directory's name ends in
DIR_SUFFIX = "_openvino_model"
#: the rt_info section the ONNX frontend puts the ONNX file's metadata_props in
RT_SECTION = "framework"


def require_openvino():
    """Import openvino, or say how to install the extra."""
    try:
        import openvino
    except ImportError as exc:   # pragma: no cover - the test extra installs it
        raise ImportError("OpenVINO export and runtime need the 'openvino' package: "
                          "pip install 'libreyolo-graphs[openvino]'") from exc
    return openvino


def default_dir(model) -> Path:
    """``<stem>_openvino_model`` next to the checkpoint the model came from, else ``<family>-<size>_openvino_model``."""
    from .onnx import default_path
    onnx_path = default_path(model)
    return onnx_path.with_name(onnx_path.stem + DIR_SUFFIX)


def export_openvino(model, file: str | os.PathLike | None = None, *, half: bool = False, **onnx_opts: Any) -> Path:
    """Write ``model`` as an OpenVINO IR directory; returns the directory.

    ``file``: the directory (default :func:`default_dir`); a path ending in ``.xml`` names the IR
    file itself (its ``.bin`` beside it). ``onnx_opts``: the ONNX export's options (imgsz, batch,
    dynamic, simplify, opset, max_det, max_nms, agnostic_nms, topk), which shape the graph.
    ``half=True`` is refused: the IR is written in float32, the precision the parity tests hold it to.
    """
    from ..options import parse_bool
    if parse_bool("half", half):
        raise ValueError("half=True: the OpenVINO export writes float32 weights (OpenVINO's CPU plugin chooses its "
                         "own compute precision; this loader pins float32); export with half=False")
    ov = require_openvino()
    from .onnx import export_onnx
    target = Path(file).expanduser() if file is not None else default_dir(model)
    if target.suffix.lower() == ".xml":
        out_dir, stem = target.parent, target.stem
    elif target.suffix.lower() in (".onnx", ".bin", ".pt", ".pth", ".safetensors"):
        raise ValueError(f"the OpenVINO export writes a directory (or a .xml file), got {str(target)!r}")
    else:
        name = target.name[:-len(DIR_SUFFIX)] if target.name.endswith(DIR_SUFFIX) else target.name
        out_dir, stem = target, name or f"{model.FAMILY}-{model.size}"
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{str(out_dir)!r} exists and is not a directory: the OpenVINO export writes a directory")
    t0 = time.perf_counter()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp:
        onnx_path = export_onnx(model, Path(tmp) / f"{stem}.onnx", **onnx_opts)
        ir = ov.Core().read_model(str(onnx_path))
        xml = Path(tmp) / "ir" / f"{stem}.xml"
        ov.save_model(ir, str(xml), compress_to_fp16=False)
        out_dir.mkdir(exist_ok=True)
        for suffix in (".bin", ".xml"):   # the xml last: a reader that finds it finds its weights
            os.replace(xml.with_suffix(suffix), out_dir / f"{stem}{suffix}")
    path = out_dir / f"{stem}.xml"
    size = sum(p.stat().st_size for p in (path, path.with_suffix(".bin")))
    log.info("exported %s-%s to %s (OpenVINO %s, %.1f s, %.1f MB)", model.FAMILY, model.size, out_dir,
             ov.get_version(), time.perf_counter() - t0, size / 1e6)
    return out_dir


def find_xml(path: str | os.PathLike) -> Path:
    """The IR file an OpenVINO path names: a ``.xml`` file, or a directory holding exactly one."""
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(p.glob("*.xml"))
        if len(found) != 1:
            raise FileNotFoundError(f"OpenVINO model directory {str(p)!r} holds {len(found)} .xml files "
                                    f"({', '.join(f.name for f in found) or 'none'}); it should hold the one "
                                    "model.export(format='openvino') wrote")
        p = found[0]
    if not p.is_file():
        raise FileNotFoundError(f"OpenVINO model {str(p)!r} not found")
    if not p.with_suffix(".bin").is_file():
        raise FileNotFoundError(f"OpenVINO model {str(p)!r} has no weights file {p.with_suffix('.bin').name} beside it")
    return p


def is_openvino_path(path: Path) -> bool:
    """Whether ``LibreYOLO(path)`` should load ``path`` as an OpenVINO model: a ``.xml`` file, a
    directory named ``*_openvino_model`` or an existing directory with a ``.xml`` file in it."""
    if path.suffix.lower() == ".xml" or path.name.endswith(DIR_SUFFIX):
        return True
    return path.is_dir() and any(path.glob("*.xml"))
