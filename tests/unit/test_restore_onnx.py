"""Restore exports loaded back: ``LibreYOLO("x.onnx")`` tiles and blends whole images around the
tile network's onnxruntime session with the restore task's own code, and gives eager predict's
pictures (up to onnxruntime's rounding: a level at most, on a few pixels)."""
import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.nafnet import nn as nafnet_nn
from libreyolo.models.nafnet.model import NAFNet
from libreyolo.models.registry import get_family

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module", autouse=True)
def tiny_nafnet():
    """A 'tiny' NAFNet (width 8, one block a level) for a fast export (the real ones trace 28 blocks)."""
    nafnet_nn.CONFIGS["tiny"] = (8, 1, (1, 1, 1, 1), (1, 1, 1, 1))
    sizes = NAFNet.SIZES
    NAFNet.SIZES = (*sizes, "tiny")
    yield
    NAFNet.SIZES = sizes
    del nafnet_nn.CONFIGS["tiny"]


def image(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def model(family, size, imgsz):
    torch.manual_seed(0)
    return get_family(family).new(size, device="cpu", imgsz=imgsz)


def assert_close_pictures(a, b):
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    assert a.shape == b.shape and d.max() <= 1 and (d > 0).mean() <= 1e-3, (d.max(), (d > 0).mean())


def test_nafnet_export_predicts_as_eager(tmp_path):
    m = model("nafnet", "tiny", 32)
    o = LibreYOLO(str(m.export(file=tmp_path / "nafnet.onnx", imgsz=32)), device="cpu")
    assert type(o).__name__ == "OnnxRestoreModel" and (o.scale, o.TASK, o.dynamic) == (1, "restore", False)
    assert "unclamped" in o.output_names
    srcs = [image(45, 70), image(20, 24, 1)]   # overlapping tiles; an image smaller than a tile (reflect-padded)
    want = m(srcs, tile_batch=1)
    got = o(srcs)                               # a static export's tile_batch is its batch (1)
    for a, b in zip(want, got):
        assert type(b.image).__name__ == "RestoredImage" and b.image.scale == 1
        assert_close_pictures(a.image.array, b.image.array)
    assert set(got[0].speed) >= {"preprocess", "inference", "postprocess"}
    with pytest.raises(ValueError, match="tile_batch=2"):
        o(srcs[0], tile_batch=2)
    with pytest.raises(ValueError, match="imgsz=64"):
        o(srcs[0], imgsz=64)
    with pytest.raises(NotImplementedError, match="PyTorch engine"):
        o(srcs[0], cuda_graph=True)


def test_super_resolution_dynamic_export_takes_any_tile_and_batch(tmp_path):
    m = model("realesrgan", "x4t", 16)
    o = LibreYOLO(str(m.export(file=tmp_path / "sr.onnx", imgsz=16, dynamic=True)), device="cpu")
    assert o.dynamic and o.restore_scale == 4
    src = image(30, 41, 2)
    for opts in ({"tile_batch": 3, "tile_overlap": 4}, {"imgsz": 24, "tile_batch": 2}):
        want, got = m(src, **opts), o(src, **opts)
        assert got.image.array.shape == (120, 164, 3)
        assert_close_pictures(want.image.array, got.image.array)
