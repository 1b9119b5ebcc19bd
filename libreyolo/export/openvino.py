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


def export_openvino(model, file: str | os.PathLike | None = None, *, half: bool = False, int8: bool = False,
                    data: Any = None, **onnx_opts: Any) -> Path:
    """Write ``model`` as an OpenVINO IR directory; returns the directory.

    ``file``: the directory (default :func:`default_dir`); a path ending in ``.xml`` names the IR
    file itself (its ``.bin`` beside it). ``onnx_opts``: the ONNX export's options (imgsz, batch,
    dynamic, simplify, opset, max_det, max_nms, agnostic_nms, topk), which shape the graph.
    ``half=True`` is refused: the IR is written in float32, the precision the parity tests hold it to.
    ``int8=True``: NNCF's post-training quantization (:func:`quantize_int8`) calibrated on the
    training images of ``data`` (a built-in set's name or a dataset YAML of the model's task).
    """
    from ..options import parse_bool
    if parse_bool("half", half):
        raise ValueError("half=True: the OpenVINO export writes float32 weights (OpenVINO's CPU plugin chooses its "
                         "own compute precision; this loader pins float32); export with half=False")
    int8 = parse_bool("int8", int8)
    if int8 and data is None:
        raise ValueError("int8=True needs calibration images: pass data= (a built-in set such as 'shapes', or a "
                         "dataset YAML of the model's task; its training images are used)")
    if not int8 and data is not None:
        raise ValueError("data= is the int8 calibration set; it is used only with int8=True")
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
        if int8:
            ir = quantize_int8(model, ir, data, int(onnx_opts.get("imgsz") or model.imgsz))
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


#: calibration images NNCF sees at most (its own default subset size)
CALIBRATION_IMAGES = 300


def calibration_images(model, data: Any, limit: int | None = None) -> list:
    """The first ``limit`` training images (sorted by path) of ``data``, resolved by the model's
    task (a built-in set is generated on first use), loaded as predict loads them."""
    from ..data.sources import load_sources
    limit = CALIBRATION_IMAGES if limit is None else int(limit)
    resolved = model.task_def.resolve_data(data)
    split = getattr(resolved, "train", None)
    if not split:
        raise ValueError(f"int8 calibration: {data!r} has no training images for the {model.TASK} task")
    paths = sorted({Path(getattr(s, "image", s[0] if isinstance(s, (tuple, list)) else s)) for s in split})
    return load_sources([str(p) for p in paths[:limit]])


def quantize_int8(model, ir, data: Any, size: int):
    """NNCF's post-training quantization of the IR ``ir`` (int8 weights and activations where its
    pattern matcher places them; the post-processing after the network stays float): the
    activation ranges from the graph run on :func:`calibration_images`, each resized as predict
    resizes it, with predict's default thresholds as the graph's other inputs."""
    try:
        import nncf
    except ImportError as exc:
        raise ImportError("int8=True needs NNCF: pip install 'libreyolo-graphs[openvino]'") from exc
    import numpy as np
    import torch
    items = calibration_images(model, data)
    names = [i.get_any_name() for i in ir.inputs]
    defaults = model.task_def.predict_defaults
    extra = {"conf_threshold": np.array([defaults.get("conf", 0.25)], np.float32),
             "iou_threshold": np.array([defaults.get("iou", 0.45)], np.float32),
             "class_mask": np.ones(int(model.nc), np.float32)}
    batch = int(ir.inputs[0].get_partial_shape()[0].get_length()) if ir.inputs[0].get_partial_shape()[0].is_static \
        else 1

    def feed(item):
        x = model.preprocess.resize_images(torch.as_tensor(item.image)[None], size)
        if batch > 1:
            x = x.expand(batch, -1, -1, -1)
        return {n: (x.numpy() if n == "images" else extra[n]) for n in names}

    log.info("int8: calibrating %s-%s on %d images of %s (NNCF %s)", model.FAMILY, model.size, len(items), data,
             nncf.__version__)
    q = nncf.quantize(ir, nncf.Dataset(items, feed), subset_size=len(items))
    q.set_rt_info("true", [RT_SECTION, "int8"])
    q.set_rt_info(f"{data} ({len(items)} training images, NNCF {nncf.__version__})", [RT_SECTION, "calibration"])
    return q
