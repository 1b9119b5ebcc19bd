"""TensorRT (``format="engine"``): the engine is built from the ONNX export with TensorRT's Python
API and needs an NVIDIA GPU and the ``tensorrt`` package. The CPU tests check what can be checked
here: the ONNX graph the builder consumes (float32 whatever ``half`` says, onnxruntime equals
eager), the engine file's header, and the refusals (no CUDA, no tensorrt, a two-graph task, a
foreign file). The GPU test builds fp32 and fp16 engines of yolo9-t and compares them with eager
predict; it is marked ``cuda`` and skips where tensorrt is not installed.
"""
from __future__ import annotations

import json
import types

import onnx
import pytest
import torch
from export_parity import filled_model, parity_images, pick_conf
from test_export_onnx import _toy

from libreyolo import LibreYOLO
from libreyolo.export import tensorrt as trtx

pytestmark = pytest.mark.usefixtures("one_thread")


def test_engine_onnx_is_float32_and_matches_eager(tmp_path):
    """The graph the builder parses: float32 initializers (TensorRT chooses fp16 kernels itself),
    the library's metadata, and onnxruntime's probabilities equal to eager's."""
    m = _toy()
    path = trtx.engine_onnx(m, tmp_path / "toy.onnx", imgsz=64)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    kinds = {onnx.TensorProto.DataType.Name(t.data_type) for t in proto.graph.initializer if len(t.dims) >= 2}
    assert kinds == {"FLOAT"}
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["task"] == "classify" and json.loads(meta["half"]) is False
    o = LibreYOLO(str(path))
    for img in parity_images():
        assert float((m.predict(img).probs.data - o.predict(img).probs.data).abs().max()) <= 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_engine_build_without_cuda_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="need an NVIDIA GPU with CUDA"):
        _toy().export(format="engine", file=tmp_path / "toy.engine", imgsz=64)
    assert not (tmp_path / "toy.engine").exists()


def test_two_graph_tasks_and_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="two ONNX graphs"):
        trtx.export_engine(types.SimpleNamespace(TASK="ocr"), tmp_path / "x.engine")
    with pytest.raises(ValueError, match="int8=True needs calibration images"):
        trtx.export_engine(_toy(), tmp_path / "x.engine", int8=True)
    with pytest.raises(ValueError, match="only with int8=True"):
        trtx.export_engine(_toy(), tmp_path / "x.engine", data="shapes-cls")


def test_engine_file_header_round_trip_and_foreign_files(tmp_path):
    meta = {"libreyolo_format": "1", "family": "toy", "precision": "fp16"}
    p = tmp_path / "a.engine"
    trtx.write_engine(p, meta, b"\x00serialized")
    assert trtx.read_engine(p) == (meta, b"\x00serialized")
    bad = tmp_path / "b.engine"
    bad.write_bytes(b"not an engine at all")
    with pytest.raises(ValueError, match="not a libreyolo TensorRT engine"):
        LibreYOLO(bad)   # refused on the header, before anything needs a GPU
    with pytest.raises(FileNotFoundError, match="not found"):
        LibreYOLO(tmp_path / "missing.engine")


@pytest.mark.cuda
@pytest.mark.parametrize("half", [False, True])
def test_engine_matches_eager_on_gpu(tmp_path, half):
    """yolo9-t (the fixtures' fill weights) at 160: an fp32 engine gives eager's detections (each
    with a counterpart of the same class, box within 0.1 image px, score within 1e-3); an fp16 one
    matches at least 90% of them within 2 px and 1e-2."""
    pytest.importorskip("tensorrt", reason="tensorrt is not installed on this machine (pip install tensorrt)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    m = filled_model("yolo9", "t", 160)
    path = m.export(format="engine", file=tmp_path / "y.engine", imgsz=160, half=half)
    o = LibreYOLO(path)
    assert o.precision == ("fp16" if half else "fp32")
    for img in parity_images():
        eager = m.predict(img, conf=0.001, max_det=300)
        conf = pick_conf(eager.boxes.conf.numpy())
        a, b = m.predict(img, conf=conf).boxes, o.predict(img, conf=conf).boxes
        box_tol, score_tol, share = (2.0, 1e-2, 0.9) if half else (0.1, 1e-3, 1.0)
        same = ((a.cls[:, None] == b.cls[None, :]) & ((a.conf[:, None] - b.conf[None, :]).abs() <= score_tol)
                & ((a.xyxy[:, None, :] - b.xyxy[None, :, :]).abs().amax(-1) <= box_tol))
        assert len(a) > 0 and same.any(1).float().mean() >= share
