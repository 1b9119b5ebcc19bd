"""LibreYOLO(...): names that are none of ours fail at once; custom files load; one UNTRAINED warning."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo import weights as W
from libreyolo.models.registry import FAMILIES


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, str]]:
    """Downloads allowed by the environment, but every hub call is recorded and refused."""
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "0")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("LIBREYOLO_HF_REPO", raising=False)
    monkeypatch.chdir(tmp_path)
    calls: list[tuple[str, str]] = []

    def probe(repo: str, filename: str, endpoint: str, timeout: float) -> None:
        calls.append((repo, filename))
        raise W._HubUnreachable("hub refused by the test")

    def download(**kwargs: object) -> None:
        raise AssertionError("hf_hub_download called")

    monkeypatch.setattr(W, "_probe_hub", probe)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", download)
    return calls


@pytest.mark.parametrize("name", ["yolov8n.pt", "runs/train/exp/weights/best.pt", "LibreYOLOv8n.safetensors"])
def test_unknown_missing_name_fails_at_once_without_the_hub(no_hub: list, name: str) -> None:
    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as info:
        LibreYOLO(name, device="cpu")
    assert time.monotonic() - start < 1
    assert no_hub == []
    message = str(info.value)
    stem = Path(name).stem
    assert f"'{stem}' is not a libreyolo model family" in message and "hub was not contacted" in message
    assert str(Path(name).absolute()) in message and "weights cache" in message
    for family, cls in FAMILIES.items():
        assert f"  - {family}: {cls.FILE_PREFIX}<size>.pt, sizes {', '.join(cls.SIZES)}" in message
    assert "LibreYOLO9t.pt" in message and "LibreYOLOX<size>.pt" in message
    assert "'yolo9t'" in message and "LIBREYOLO_HF_REPO" in message


def test_bare_unknown_name_lists_the_families() -> None:
    with pytest.raises(ValueError) as info:
        LibreYOLO("yolov8n", device="cpu")
    assert "neither a checkpoint file" in str(info.value)
    assert all(f"  - {family}:" in str(info.value) for family in FAMILIES)


@pytest.mark.parametrize("name", ["LibreYOLO9t.pt", "LibreYOLO9c-seg.pt", "yolox-s.pt"])
def test_our_names_still_go_to_the_hub(no_hub: list, name: str) -> None:
    with pytest.raises(FileNotFoundError, match="hub refused by the test"):
        LibreYOLO(name, device="cpu")
    assert no_hub == [(W.default_repo_for(name), name)]


def test_explicit_download_or_own_repo_still_go_to_the_hub(no_hub: list, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="hub refused by the test"):
        LibreYOLO("yolov8n.pt", device="cpu", download=True)
    monkeypatch.setenv("LIBREYOLO_HF_REPO", "me/my-weights")
    with pytest.raises(FileNotFoundError, match="hub refused by the test"):
        LibreYOLO("yolov8n.pt", device="cpu")
    assert no_hub == [("LibreYOLO/yolov8n", "yolov8n.pt"), ("me/my-weights", "yolov8n.pt")]


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A yolox-n checkpoint saved under a name that is not a libreyolo file name."""
    path = tmp_path_factory.mktemp("ckpt") / "saved.pt"
    return LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0).save(path)


def test_custom_checkpoint_on_disk_loads_whatever_its_name(no_hub: list, small_checkpoint: Path, tmp_path: Path) -> None:
    for name in ("yolov8n.pt", "best.pth", "anything"):
        target = tmp_path / name
        target.write_bytes(small_checkpoint.read_bytes())
        m = LibreYOLO(str(target), device="cpu")
        assert m.FAMILY == "yolox" and m.size == "n" and m.nc == 3 and m.trained
    assert no_hub == []


def test_custom_checkpoint_in_the_weights_cache_loads(no_hub: list, small_checkpoint: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "yolov8n.pt").write_bytes(small_checkpoint.read_bytes())
    m = LibreYOLO("yolov8n.pt", device="cpu")
    assert m.FAMILY == "yolox" and m.source == str(cache / "yolov8n.pt")
    assert no_hub == []


def _untrained_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "UNTRAINED" in r.getMessage()]


def test_untrained_from_a_name_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    image = np.zeros((48, 64, 3), dtype=np.uint8)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        m = LibreYOLO("yoloxn", device="cpu")
        m(image, imgsz=64)
        m(image, imgsz=64)
    records = _untrained_records(caplog)
    assert len(records) == 1, records
    assert "building an UNTRAINED yolox-n" in records[0] and "meaningless" in records[0]


def test_untrained_from_new_warns_once_at_predict(caplog: pytest.LogCaptureFixture) -> None:
    """LibreYOLO.new is explicit, so the predictor's first call is what warns, once."""
    image = np.zeros((48, 64, 3), dtype=np.uint8)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        m = LibreYOLO.new("yolox", "n", device="cpu")
        assert _untrained_records(caplog) == []
        m(image, imgsz=64)
        m(image, imgsz=64)
    assert len(_untrained_records(caplog)) == 1


def test_a_task_suffix_names_the_family_variant(caplog):
    """'ec-s-pose' builds EC's pose variant (as the original works name it); a task the family does
    not serve here is no name of ours."""
    from libreyolo.models.registry import parse_spec
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        m = LibreYOLO("ec-s-pose", device="cpu")
    assert m.TASK == "pose" and m.FAMILY == "ec" and m.size == "s"
    assert any("UNTRAINED ec-s-pose" in r.getMessage() for r in caplog.records)
    assert parse_spec("LibreECs-pose.pt")[0] is type(m)
    assert parse_spec("yolo9t-pose") is None


@pytest.mark.parametrize("family,size", [("ppocr", "t"), ("mobilesam", "tiny")])
def test_families_with_their_own_new_take_the_factory_keywords(family, size):
    """LibreYOLO.new passes task= to every family's new, also those that override it."""
    m = LibreYOLO.new(family, size, device="cpu")
    assert m.FAMILY == family


@pytest.mark.parametrize("imgsz", [0, -1, "abc", 10**6])
def test_a_bad_imgsz_is_refused_when_the_model_is_built(imgsz) -> None:
    """imgsz=0 silently became the family's default, 'abc' failed inside int() without the
    option's name, and -1 or 10**6 were kept until the first predict refused them."""
    with pytest.raises(ValueError, match="imgsz"):
        LibreYOLO.new("yolo9", "t", nc=2, imgsz=imgsz)
    with pytest.raises(ValueError, match="imgsz"):
        LibreYOLO("yolo9t", imgsz=imgsz)


@pytest.mark.parametrize("model", ["", "  ", None])
def test_an_empty_model_name_is_refused_naming_it(model) -> None:
    """'' was read as the current folder ('cannot load checkpoint '.''), None as the name 'None'."""
    with pytest.raises((ValueError, TypeError), match="model"):
        LibreYOLO(model)


@pytest.mark.parametrize("dtype", [torch.int32, torch.complex64])
def test_weights_of_another_kind_of_number_are_refused(tmp_path: Path, dtype: torch.dtype) -> None:
    """load_state_dict casts integer or complex tensors into float weights silently (a model of
    truncated or real-part numbers); a float16 file into the float32 model still loads."""
    m = LibreYOLO.new("yolo9", "t", nc=2, imgsz=64, device="cpu")
    m.save(tmp_path / "good.pt")
    ckpt = torch.load(tmp_path / "good.pt", weights_only=True)
    half = {**ckpt, "model": {k: v.half() if v.is_floating_point() else v for k, v in ckpt["model"].items()}}
    torch.save(half, tmp_path / "half.pt")
    assert LibreYOLO(str(tmp_path / "half.pt")).nc == 2
    bad = {**ckpt, "model": {k: v.to(dtype) if v.is_floating_point() else v for k, v in ckpt["model"].items()}}
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=rf"bad\.pt does not match yolo9-t: \d+ of the wrong kind of number "
                                         rf"\(e\.g\. [\w.]+: checkpoint {dtype} vs model torch\.float32"):
        LibreYOLO(str(tmp_path / "bad.pt"))


def test_a_checkpoint_of_another_task_is_refused_naming_it(tmp_path: Path) -> None:
    """A checkpoint whose task the family does not serve here (a yolo9 file saying classify, or the
    reference's yolo9 segment models) is refused, not loaded as a detector; the family's own task
    and a variant's still load."""
    m = LibreYOLO.new("yolo9", "t", nc=2, imgsz=64, device="cpu")
    m.save(tmp_path / "good.pt")
    ckpt = torch.load(tmp_path / "good.pt", weights_only=True)
    assert ckpt["task"] == "detect" and LibreYOLO(str(tmp_path / "good.pt")).task == "detect"
    for task in ("classify", "segment"):
        torch.save({**ckpt, "task": task}, tmp_path / f"{task}.pt")
        with pytest.raises(ValueError, match=rf"{task}\.pt: its task is '{task}', but the yolo9 family here "
                                             r"serves detect"):
            LibreYOLO(str(tmp_path / f"{task}.pt"))
    pose = LibreYOLO.new("ec", "s", task="pose", nc=1, device="cpu")
    pose.save(tmp_path / "pose.pt")
    assert LibreYOLO(str(tmp_path / "pose.pt")).task == "pose"
