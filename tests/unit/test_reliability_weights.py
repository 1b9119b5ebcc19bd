"""Reliability of options and weight files: a bad seed, max_det or nc is refused by the Python API
with a message naming it; a corrupt ONNX file, a checkpoint with NaN/inf weights and a .pt whose
zip CRC fails are refused naming the file (and the bad tensor / zip entry)."""
from __future__ import annotations

import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo import weights as W
from libreyolo.options import MAX_DET, MAX_SEED, OptionError, check_max_det, check_seed
from libreyolo.results import Results

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

IMAGE = np.full((48, 64, 3), 127, np.uint8)


@pytest.fixture(scope="module")
def tiny():
    """An untrained yolo9-t with 2 classes (its detections do not matter here)."""
    torch.manual_seed(0)
    return LibreYOLO.new("yolo9", "t", nc=2, device="cpu", imgsz=64)


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory) -> Path:
    """``tiny`` exported to ONNX at 64 px."""
    pytest.importorskip("onnxruntime")
    return tiny.export(file=tmp_path_factory.mktemp("onnx") / "tiny.onnx", imgsz=64)


# ------------------------------------------------------------------------------------- seed (6)


@pytest.mark.parametrize("seed", [-1, 2**40])
def test_train_refuses_a_seed_numpy_cannot_take(tiny, seed):
    with pytest.raises(OptionError, match=re.escape(f"seed must be an integer in [0, {MAX_SEED}], got {seed}")):
        tiny.train(data="shapes", epochs=1, seed=seed)


def test_seed_range_is_numpys():
    assert check_seed(0) == 0 and check_seed(str(MAX_SEED)) == MAX_SEED == 2**32 - 1
    np.random.seed(MAX_SEED)   # the bound is what numpy's seeding takes
    with pytest.raises(OptionError, match=re.escape("seed must be an integer in [0, 4294967295], got -1")):
        LibreYOLO.new("yolo9", "t", nc=2, device="cpu", seed=-1)


# ---------------------------------------------------------------------------------- max_det (9)


def test_too_large_max_det_names_max_det_and_its_range(tiny):
    with pytest.raises(OptionError) as info:
        tiny.predict(IMAGE, imgsz=64, max_det=10**9)
    assert str(info.value) == f"max_det must be an integer in [1, {MAX_DET}], got 1000000000"


def test_max_nms_not_given_follows_a_large_max_det(tiny):
    assert check_max_det(300) == (300, 1000) and check_max_det(5000) == (5000, 5000)
    tiny.predict(IMAGE, imgsz=64, max_det=2000, conf=0.9)   # max_nms was 1000 and refused it
    plan = tiny.task_def.plan(tiny, 64, None, max_det=2000)
    assert (plan.max_det, plan.max_nms) == (2000, 2000)


def test_max_nms_below_max_det_names_both(tiny):
    with pytest.raises(OptionError, match=re.escape("max_nms=500 is smaller than max_det=1000")):
        tiny.predict(IMAGE, imgsz=64, max_det=1000, max_nms=500)
    with pytest.raises(OptionError, match=re.escape("max_nms=500 is smaller than max_det=1000")):
        tiny.export(file="never.onnx", max_det=1000, max_nms=500)


def test_export_with_a_large_max_det_and_predict_from_it(tiny, tmp_path):
    pytest.importorskip("onnxruntime")
    path = tiny.export(file=tmp_path / "big.onnx", imgsz=64, max_det=1500)
    o = LibreYOLO(str(path), device="cpu")
    assert (o.max_det, o.max_nms) == (1500, 1500)
    assert isinstance(o.predict(IMAGE, conf=0.9), Results)   # predict's default max_nms followed too


def test_cli_export_leaves_max_nms_to_max_det_and_checks_the_seeds_range():
    from libreyolo.cli import EXPORT, TRAIN, UsageError, _parse
    assert _parse(["max_det=2000"], EXPORT, "export")["max_nms"] is None
    with pytest.raises(UsageError, match=re.escape(f"seed must be an integer in [0, {MAX_SEED}]")):
        _parse([f"seed={2**40}"], TRAIN, "train")


# ------------------------------------------------------------------------------ corrupt ONNX (7)


def _onnx_refused(path: Path):
    return pytest.raises(ValueError, match=rf"cannot load ONNX model '.*{re.escape(path.name)}': not a readable "
                                           r"ONNX model, the file is corrupt or truncated \(.+\); export it again")


@pytest.mark.parametrize("how", ["half", "last_bytes", "random", "empty", "bad_operator"])
def test_corrupt_onnx_file_is_named(exported, tmp_path, how):
    data = exported.read_bytes()
    if how == "half":
        data = data[: len(data) // 2]
    elif how == "last_bytes":
        data = data[:-10]
    elif how == "random":
        data = np.random.default_rng(0).bytes(5000)
    elif how == "empty":
        data = b""
    else:   # parses as protobuf, but onnxruntime cannot load the graph
        i = data.find(b"Conv")
        data = data[: i + 1] + b"z" + data[i + 2:]
    bad = tmp_path / f"{how}.onnx"
    bad.write_bytes(data)
    with _onnx_refused(bad):
        LibreYOLO(str(bad), device="cpu")


# ----------------------------------------------------------------------------- nc with a file (11)


def test_nc_differing_from_the_checkpoints_is_refused(tmp_path):
    path = LibreYOLO.new("yolo9", "t", nc=5, device="cpu").save(tmp_path / "best.pt")
    with pytest.raises(ValueError) as info:
        LibreYOLO(str(path), nc=3, device="cpu")
    msg = str(info.value)
    assert re.match(r"nc=3, but checkpoint '.*best\.pt' has 5 classes", msg), msg
    assert "model.reset_classes(3)" in msg
    assert LibreYOLO(str(path), nc=5, device="cpu").nc == 5   # the same nc: accepted
    with pytest.raises(OptionError, match=re.escape("nc must be an integer >= 1, got 0")):
        LibreYOLO(str(path), nc=0, device="cpu")
    m = LibreYOLO(str(path), device="cpu")
    m.reset_classes(3)   # what the message points to
    assert m.nc == 3


def test_nc_differing_from_an_onnx_files_is_refused(exported):
    with pytest.raises(ValueError, match=r"nc=3, but the ONNX model '.*tiny\.onnx' has 2 classes"):
        LibreYOLO(str(exported), nc=3, device="cpu")
    assert LibreYOLO(str(exported), nc=2, device="cpu").nc == 2


# ------------------------------------------------------------------------- NaN / inf weights (12)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, suffix, bad):
    m = LibreYOLO.new("yolo9", "t", nc=2, device="cpu")
    ck = m.checkpoint()
    key = next(k for k, v in ck["model"].items() if v.is_floating_point() and v.numel() > 4)
    ck["model"][key] = ck["model"][key].clone()
    ck["model"][key].view(-1)[:3] = bad
    path = W.save_checkpoint(ck, tmp_path / f"broken{suffix}")
    pattern = (rf"cannot load checkpoint '.*broken{re.escape(suffix)}': its weights are not all finite: "
               rf"tensor '{re.escape(key)}' .* holds 3 non-finite value\(s\)")
    with pytest.raises(ValueError, match=pattern):
        W.load_checkpoint(path)
    with pytest.raises(ValueError, match=pattern):
        LibreYOLO(str(path), device="cpu")
    assert not torch.isfinite(W.load_checkpoint(path, check_finite=False)["model"][key]).all()   # to inspect it


def test_non_finite_resume_weights_are_refused(tmp_path):
    ck = {"model": {"w": torch.ones(3)}, "train_state": {"model_raw": {"w": torch.tensor([1.0, float("nan")])},
                                                         "epoch": 0}}
    path = W.save_checkpoint(ck, tmp_path / "last.pt")
    with pytest.raises(ValueError, match=r"last\.pt'.*tensor 'train_state\.model_raw\.w' \(2,\) holds 1 non-finite"):
        W.load_checkpoint(path)


def test_anchor_masks_may_hold_inf_but_not_nan(tmp_path):
    """The DETR decoders' native-size anchor logits are +inf where a box is off the image."""
    anchors = torch.tensor([[0.5, float("inf")]])
    W.save_checkpoint({"model": {"decoder.anchors": anchors, "w": torch.ones(2)}}, tmp_path / "ok.pt")
    assert torch.equal(W.load_checkpoint(tmp_path / "ok.pt")["model"]["decoder.anchors"], anchors)
    W.save_checkpoint({"model": {"decoder.anchors": torch.tensor([float("nan")])}}, tmp_path / "nan.pt")
    with pytest.raises(ValueError, match="decoder.anchors"):
        W.load_checkpoint(tmp_path / "nan.pt")


def test_a_real_detr_checkpoint_with_inf_anchors_still_loads(tmp_path):
    m = LibreYOLO.new("rtdetrv2", "r18", nc=2, device="cpu")
    assert not torch.isfinite(m.checkpoint()["model"]["decoder.anchors"]).all()
    assert LibreYOLO(str(m.save(tmp_path / "detr.pt")), device="cpu").nc == 2


# ------------------------------------------------------------------------- corrupt .pt zip (14)


def _data_offset(path: Path, member: zipfile.ZipInfo) -> int:
    raw = path.read_bytes()
    n, m = struct.unpack("<HH", raw[member.header_offset + 26: member.header_offset + 30])
    return member.header_offset + 30 + n + m


def test_a_flipped_byte_in_a_pt_is_found_by_the_zip_crc(tmp_path):
    good = W.save_checkpoint({"model": {"w": torch.randn(64, 64)}, "nc": 2}, tmp_path / "good.pt")
    with zipfile.ZipFile(good) as zf:
        member = max(zf.infolist(), key=lambda i: i.file_size)   # the tensor's bytes
    data = bytearray(good.read_bytes())
    data[_data_offset(good, member) + 100] ^= 0x01
    bad = tmp_path / "flipped.pt"
    bad.write_bytes(bytes(data))
    assert torch.load(bad, weights_only=True)["model"]["w"].shape == (64, 64)   # torch alone loads it
    with pytest.raises(ValueError, match=rf"cannot load checkpoint '.*flipped\.pt': its zip entry "
                                         rf"'{re.escape(member.filename)}' fails its CRC check"):
        W.load_checkpoint(bad)


def test_a_legacy_non_zip_torch_file_still_loads(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save({"model": {"w": torch.ones(3)}, "nc": 1}, path, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(path)
    assert torch.equal(W.load_checkpoint(path)["model"]["w"], torch.ones(3))


@pytest.mark.parametrize("how", ["extra_bytes", "short_header"])
def test_safetensors_header_must_parse_and_cover_the_file(tmp_path, how):
    good = W.save_checkpoint({"model": {"w": torch.randn(8, 8)}}, tmp_path / "good.safetensors")
    data = good.read_bytes()
    if how == "extra_bytes":
        data += b"\0" * 16
    else:   # the header's declared length cut by one byte: it no longer parses
        n = struct.unpack("<Q", data[:8])[0]
        data = struct.pack("<Q", n - 1) + data[8:]
    bad = tmp_path / f"{how}.safetensors"
    bad.write_bytes(data)
    with pytest.raises(ValueError, match=rf"cannot load checkpoint '.*{how}\.safetensors': not a valid safetensors"):
        W.load_checkpoint(bad)
