"""``model.export(format="torchscript")``: the network as a TorchScript module (``torch.jit.trace``).

What is traced is :meth:`~libreyolo.models.base.Model.infer`, the part predict runs between the
preprocessing and the task's post-processing: a (B, 3, S, S) float batch, preprocessed as
``model.preprocess`` says (resized and padded, values in [0, 1]; a family that normalizes does so
inside ``infer``), in; the family's fixed-shape raw outputs (detection: boxes, best score, class per
candidate, before the confidence threshold and NMS) out. The file loads back with
``torch.jit.load`` (no libreyolo needed) and carries this model's metadata (family, size, task,
classes, input size, preprocessing) as the extra file ``libreyolo.json``; ``LibreYOLO(path)`` does
not load it (the ONNX export is the one that runs behind the predict API).
"""
from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path

import torch
from torch import nn

#: the extra file in the archive that holds the model's metadata
METADATA_FILE = "libreyolo.json"


class _Infer(nn.Module):
    """``model.infer`` on ``net`` as a module with one tensor input."""

    def __init__(self, model, net: nn.Module):
        super().__init__()
        self.net = net
        self._infer = model.infer_with(net)

    def forward(self, x: torch.Tensor):
        return self._infer(x)


def metadata(model, size: int, batch: int) -> dict:
    """What the archive's ``libreyolo.json`` says about the traced network."""
    from .. import __version__
    return {"family": model.FAMILY, "size": model.size, "task": model.TASK, "nc": int(model.nc),
            "names": {int(k): v for k, v in model.names.items()}, "imgsz": size, "batch": batch,
            "input": "float (B, 3, imgsz, imgsz), preprocessed as 'preprocess' says, values in [0, 1]",
            "preprocess": model.preprocess.as_dict(), "libreyolo_version": __version__}


def export_torchscript(model, file: str | os.PathLike | None = None, *, imgsz: int | None = None,
                       batch: int = 1) -> Path:
    """Trace ``model``'s network (see the module docstring) at ``imgsz`` (default the model's) and
    ``batch``, and write it to ``file`` (default: beside the checkpoint, ``.torchscript``); returns
    the path. The traced module's outputs equal ``model.infer``'s on the CPU."""
    from ..options import check_imgsz, check_int
    size = check_imgsz(model.imgsz if imgsz is None else imgsz, model.STRIDE)
    batch = check_int("batch", batch, 1)
    path = Path(file if file is not None else _default_path(model)).expanduser()
    net = copy.deepcopy(model.model).to("cpu").eval()
    wrapper = _Infer(model, net).eval()
    x = torch.rand((batch, 3, size, size), generator=torch.Generator().manual_seed(0))
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")   # the tracer's notes on Python values becoming constants
            traced = torch.jit.trace(wrapper, (x,), strict=False, check_trace=False)
    except Exception as exc:
        raise RuntimeError(f"TorchScript export of {model.FAMILY}-{model.size} failed while tracing its network: "
                           f"{type(exc).__name__}: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)   # torch's note that torch.export is its successor
            torch.jit.save(traced, str(tmp), _extra_files={METADATA_FILE: json.dumps(metadata(model, size, batch))})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_metadata(path: str | os.PathLike) -> dict:
    """The metadata an exported TorchScript file carries."""
    extra = {METADATA_FILE: ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    return json.loads(extra[METADATA_FILE])


def _default_path(model) -> Path:
    src = Path(model.source) if model.source and Path(str(model.source)).suffix else None
    if src is not None:
        return src.with_suffix(".torchscript")
    return Path(f"{model.FILE_PREFIX or model.FAMILY}{model.size}.torchscript")
