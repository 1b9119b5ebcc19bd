"""OpenVINO int8: NNCF's post-training quantization of the exported IR, calibrated on a built-in
set's training images (``model.export(format="openvino", int8=True, data=...)``).

The toy classifier of the ONNX tests, calibrated on 8 images of the built-in ``shapes-cls`` set
(NNCF's statistics collection costs minutes on a real network on two shared cores; the accuracy
of a trained detector, fp32 against int8, is in docs/benchmarks.md, "OpenVINO int8"). Asserted:
the int8 IR is marked in its metadata, holds int8 weights (FakeQuantize / quantized constants),
loads behind ``LibreYOLO(path)``, predicts, and its probabilities stay within ``PROB_TOL`` of the
float32 IR's with the same top-1 class.
"""
from __future__ import annotations

import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from export_parity import parity_images  # noqa: E402
from test_export_onnx import _toy  # noqa: E402

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.export import openvino as ovx  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: the largest difference of an int8 probability from the float32 IR's (measured: see the test)
PROB_TOL = 0.05


@pytest.fixture(scope="module")
def int8_pair(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setattr(ovx, "CALIBRATION_IMAGES", 8)
    try:
        m = _toy()
        d = tmp_path_factory.mktemp("int8")
        fp32 = LibreYOLO(m.export(format="openvino", file=d / "fp32_openvino_model", imgsz=64))
        int8 = LibreYOLO(m.export(format="openvino", file=d / "int8_openvino_model", imgsz=64, int8=True,
                                  data="shapes-cls"))
    finally:
        mp.undo()
    return m, fp32, int8


def test_int8_ir_is_quantized_and_marked(int8_pair):
    _, fp32, int8 = int8_pair
    info = int8._ir.get_rt_info()["framework"]
    assert info["int8"].astype(str) == "true" and "shapes-cls (8 training images" in info["calibration"].astype(str)
    ops = {op.get_type_name() for op in int8._ir.get_ops()}
    assert "FakeQuantize" in ops or "FakeConvert" in ops or any(
        op.get_element_type().get_type_name() in ("i8", "u8") for op in int8._ir.get_ops() if op.get_type_name() == "Constant")
    assert "FakeQuantize" not in {op.get_type_name() for op in fp32._ir.get_ops()}


def test_int8_predicts_within_distance_of_fp32(int8_pair):
    _, fp32, int8 = int8_pair
    worst = 0.0
    for img in parity_images():
        a, b = fp32.predict(img).probs, int8.predict(img).probs
        worst = max(worst, float((a.data - b.data).abs().max()))
        assert a.top1 == b.top1
    assert worst <= PROB_TOL


def test_int8_needs_calibration_data_and_openvino(int8_pair, tmp_path):
    m, _, _ = int8_pair
    with pytest.raises(ValueError, match="int8=True needs calibration images"):
        m.export(format="openvino", file=tmp_path / "x_openvino_model", int8=True)
    with pytest.raises(ValueError, match="only with int8=True"):
        m.export(format="openvino", file=tmp_path / "x_openvino_model", data="shapes-cls")
    with pytest.raises(ValueError, match="not of format='onnx'"):
        m.export(format="onnx", file=tmp_path / "x.onnx", int8=True, data="shapes-cls")
