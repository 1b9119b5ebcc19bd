"""Code written for LibreYOLO 1.6.0 (the library this one replaces) runs here unchanged.

Each test follows that library's documented API (its README and its ``LibreYOLO`` factory's
documented arguments): the top-level names, ``LibreYOLO(path, nb_classes=, size=, task=)``, one
``Results`` for one image, the result fields' names, predict's options, and checkpoint metadata
it reads. CPU, no network, small inputs.
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch

import libreyolo
from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.options import OptionError
from libreyolo.results import Results

SIZE = 64


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A trained-format yolo9-t checkpoint under its published file name, in a folder of its own."""
    folder = tmp_path_factory.mktemp("weights")
    LibreYOLO.new("yolo9", "t", nc=80, device="cpu", seed=0).save(folder / "LibreYOLO9t.pt")
    return folder / "LibreYOLO9t.pt"


def test_readme_quick_start(weights, tmp_path, monkeypatch):
    # from the README: model = LibreYOLO("LibreYOLO9t.pt"); result = model(SAMPLE_IMAGE, save=True)
    monkeypatch.chdir(weights.parent)
    model = LibreYOLO("LibreYOLO9t.pt", device="cpu")
    result = model(SAMPLE_IMAGE, save=True, imgsz=SIZE, output_path=str(tmp_path / "out"))
    assert isinstance(result, Results)
    assert result.saved_to is not None and (tmp_path / "out" / "sample.jpg").is_file()
    assert result.boxes.xyxy.shape[1] == 4 and len(result) == len(result.boxes)


def test_every_offered_top_level_name_imports():
    for name in libreyolo._FAMILY_NAMES + libreyolo._RESULT_NAMES:
        assert getattr(libreyolo, name) is not None, name
        assert name in libreyolo.__all__ and name in dir(libreyolo)
    from libreyolo import Boxes, LibreRTDETR, LibreYOLO9, LibreYOLOX  # noqa: F401
    with pytest.warns(DeprecationWarning, match="LibreRTDETR"):
        assert libreyolo.LibreYOLORTDETR is LibreRTDETR
    with pytest.raises(AttributeError):
        _ = libreyolo.LibreRFDETR   # a family not offered here: an AttributeError, as any unknown name


def test_every_family_has_its_top_level_name():
    """A new family's file prefix (its LibreYOLO 1.6.0 class name) is offered at the top level."""
    from libreyolo.models.registry import naming
    prefixes = {prefix for prefix, _ in naming().values()}
    assert prefixes <= set(libreyolo._FAMILY_NAMES), sorted(prefixes - set(libreyolo._FAMILY_NAMES))


def test_factory_arguments_and_model_attributes(weights):
    model = LibreYOLO(str(weights), nb_classes=80, size="t", task="detect", device="cpu")
    assert model.nb_classes == 80 and model.task == "detect" and isinstance(model.task, str)
    assert model.task_def.name == "detect"   # the task object the engine uses
    with pytest.raises(ValueError, match="size='s'"):
        LibreYOLO(str(weights), size="s", device="cpu")
    with pytest.raises(ValueError, match="task='classify'"):
        LibreYOLO(str(weights), task="classify", device="cpu")
    with pytest.raises(ValueError, match="3 classes|80 classes"):
        LibreYOLO(str(weights), nb_classes=3, device="cpu")


def test_family_classes_build_and_load(weights):
    from libreyolo import LibreYOLO9, LibreYOLOX
    fresh = LibreYOLO9(None, size="t", nb_classes=3, device="cpu")
    assert isinstance(fresh, LibreYOLO9) and not isinstance(fresh, LibreYOLOX) and fresh.nb_classes == 3
    loaded = LibreYOLO9(str(weights), device="cpu")
    assert isinstance(loaded, LibreYOLO9) and loaded.size == "t"
    with pytest.raises(ValueError, match="not yolox"):
        LibreYOLOX(str(weights), device="cpu")


def test_task_argument_picks_the_family_variant():
    from libreyolo import Keypoints, LibreEC
    from libreyolo.models.ec.pose import ECPose
    from libreyolo.tasks.pose.results import Keypoints as PoseKeypoints
    pose = LibreYOLO("ecs", task="pose", nc=1, device="cpu")   # a name without suffix: task= picks the variant
    assert type(pose) is ECPose and pose.task == "pose" and pose.task_def.name == "pose"
    assert isinstance(pose, LibreEC) and Keypoints is PoseKeypoints
    seg = LibreYOLO("rtmdett", task="segment", nc=2, device="cpu")   # instance segmentation, not MobileSAM's
    assert type(seg).__name__ == "RtmdetSeg" and seg.task == "segment"
    # a name whose suffix, or a family, serves another task is refused before anything is built
    with pytest.raises(ValueError, match="ec-s-pose is a pose model; task='detect'"):
        LibreYOLO("ec-s-pose", task="detect", device="cpu")
    with pytest.raises(ValueError, match="yolo9-t is a detect model; task='pose'"):
        LibreYOLO("yolo9t", task="pose", device="cpu")
    with pytest.raises(ValueError, match="task='classify'"):
        LibreEC(None, size="s", task="classify", device="cpu")


def test_one_image_one_results_several_a_list(weights, tmp_path):
    model = LibreYOLO(str(weights), device="cpu")
    frame = np.zeros((48, 64, 3), np.uint8)   # a BGR frame, as cv2.imread gives
    one = model(frame, imgsz=SIZE)
    assert isinstance(one, Results)
    with pytest.raises(TypeError, match="without \\[0\\]"):
        one[0]
    many = model([frame, frame], imgsz=SIZE)
    assert isinstance(many, list) and len(many) == 2 and all(isinstance(r, Results) for r in many)
    assert isinstance(model.predict(SAMPLE_IMAGE, imgsz=SIZE), Results)
    assert isinstance(model(torch.zeros(1, 3, 32, 32), imgsz=SIZE), list)   # a batch stays a list
    gen = model(SAMPLE_IMAGE, imgsz=SIZE, stream=True)
    assert [type(r) for r in gen] == [Results]


def test_predict_options_of_the_reference(weights, tmp_path, caplog):
    model = LibreYOLO(str(weights), device="cpu")
    r = model(SAMPLE_IMAGE, imgsz=SIZE, save=True, output_path=str(tmp_path / "pic.png"), device="cpu")
    assert r.saved_to == str(tmp_path / "pic.png") and (tmp_path / "pic.png").is_file()
    r = model(SAMPLE_IMAGE, imgsz=SIZE, save=True, output_path=str(tmp_path / "d"), output_file_format="webp")
    assert r.saved_to == str(tmp_path / "d" / "sample.webp")
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        model(SAMPLE_IMAGE, imgsz=SIZE, half=True)
    assert any("half=True is ignored" in m for m in caplog.messages)
    assert isinstance(model(SAMPLE_IMAGE, imgsz=SIZE, color_format="bgr", augment=False, tiling=False), Results)
    for opt in ({"augment": True}, {"tiling": True, "overlap_ratio": 0.3}):   # the reference's names
        assert isinstance(model(SAMPLE_IMAGE, imgsz=SIZE, **opt), Results)
    with pytest.raises(OptionError, match="output_file_format"):
        model(SAMPLE_IMAGE, imgsz=SIZE, output_file_format="bmp")


def test_result_field_names_are_aliases():
    from libreyolo import DepthMap, Matte, SemanticMask
    img = np.zeros((8, 8, 3), np.uint8)
    sem = SemanticMask(torch.zeros(8, 8, dtype=torch.long))
    r = Results(img, "x", {0: "a"}, masks=sem)
    assert r.semantic_mask is sem
    depth = DepthMap(torch.zeros(8, 8))
    r = Results(img, "x", {0: "a"}, depth=depth)
    assert r.depth_map is r.depth is depth and r.semantic_mask is None
    alpha = Matte(torch.zeros(8, 8))
    r = Results(img, "x", {0: "a"}, alpha=alpha)
    assert r.matte is alpha
    r.ocr = "lines"
    assert r.texts == "lines"


def test_checkpoint_task_names_are_the_references(tmp_path):
    from libreyolo.compat import checkpoint_task
    assert checkpoint_task("segment-prompt") == "segment" and checkpoint_task("detect") == "detect"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sam = LibreYOLO.new("mobilesam", "tiny", device="cpu", seed=0)
    ckpt = sam.checkpoint()
    assert ckpt["task"] == "segment" and ckpt["model_family"] == "mobilesam"
    back = LibreYOLO(str(sam.save(tmp_path / "sam.pt")), task="segment", device="cpu")
    assert back.task == "segment-prompt" and back.checkpoint()["task"] == "segment"


def test_torchscript_export_loads_back_equal(weights, tmp_path):
    from libreyolo.export.torchscript import read_metadata
    model = LibreYOLO(str(weights), device="cpu")
    path = model.export(format="torchscript", imgsz=SIZE, file=tmp_path / "y.torchscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # torch's note that torch.export is its successor
        traced = torch.jit.load(str(path))
    x = torch.rand(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.infer(x)
        got = traced(x)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    meta = read_metadata(path)
    assert meta["family"] == "yolo9" and meta["task"] == "detect" and meta["imgsz"] == SIZE
    with pytest.raises(ValueError, match="options of the ONNX export"):
        model.export(format="torchscript", dynamic=True, file=tmp_path / "z.torchscript")
