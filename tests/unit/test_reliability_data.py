"""Reliability of data= and predict sources: a dataset "YAML" that is an image or binary file, data=None,
COCO boxes lying outside their image, tensors without data (meta) as sources, and stream=True
decoding a folder lazily, skipping an unreadable file found in it with a warning."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import libreyolo.data.datasets as datasets
import libreyolo.data.sources as sources
from libreyolo import LibreYOLO
from libreyolo.data.datasets import resolve_data
from libreyolo.data.sources import pending_sources
from libreyolo.tasks import get_task

SIZE = 64
DATA_TASKS = ("detect", "classify", "semantic", "depth")


def _jpeg(path: Path, seed: int = 0, hw=(40, 56)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (*hw, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, format="JPEG")
    return path


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


# ---- Defect 4: a data= file that is not a YAML --------------------------------------------------


@pytest.mark.parametrize("task", DATA_TASKS)
@pytest.mark.parametrize("name", ["photo.jpg", "data.yaml"])
def test_data_that_is_an_image_is_refused_naming_the_file(tmp_path, task, name):
    path = _jpeg(tmp_path / name)
    with pytest.raises(ValueError) as e:
        get_task(task).resolve_data(str(path))
    assert type(e.value) is ValueError   # not a bare UnicodeDecodeError
    msg = str(e.value)
    assert name in msg and "not a dataset YAML" in msg and "not UTF-8 text" in msg and "JPEG image" in msg


@pytest.mark.parametrize("task", DATA_TASKS)
def test_data_folder_whose_data_yaml_is_binary_is_refused(tmp_path, task):
    (tmp_path / "data.yaml").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"data\.yaml: not a dataset YAML: the file is not UTF-8 text \(byte 0x"):
        get_task(task).resolve_data(tmp_path)


@pytest.mark.parametrize("task", DATA_TASKS)
def test_one_reader_refuses_invalid_yaml_and_non_mappings_naming_the_file(tmp_path, task):
    bad = tmp_path / "bad.yaml"
    bad.write_text("path: [unclosed\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: not valid YAML"):
        get_task(task).resolve_data(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match=r"list\.yaml: expected a mapping with .*, got list"):
        get_task(task).resolve_data(listing)
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"path: .\n\x00\x00")
    with pytest.raises(ValueError, match=r"nul\.yaml: not a dataset YAML: the file is not UTF-8 text \(byte 0x00 "
                                         r"at offset 8"):
        datasets.read_yaml(nul, "path/train/val")


def test_a_binary_image_list_is_a_listed_problem(tmp_path):
    _jpeg(tmp_path / "images" / "val" / "v.jpg")
    _jpeg(tmp_path / "train.txt")   # a JPEG saved under the list's name
    (tmp_path / "data.yaml").write_text("path: .\ntrain: train.txt\nval: images/val\nnames: [a]\n")
    with pytest.raises(ValueError) as e:
        resolve_data(tmp_path / "data.yaml")
    assert type(e.value) is ValueError
    assert "train.txt: cannot read the image list: the file is not UTF-8 text (it looks like a JPEG image)" \
        in str(e.value)


# ---- Defect 10: data=None ------------------------------------------------------------------------


@pytest.mark.parametrize("task,builtin", [("detect", "'shapes'"), ("classify", "'shapes-cls', 'shapes'"),
                                          ("semantic", "'shapes-seg'"), ("depth", "'shapes-depth'")])
@pytest.mark.parametrize("data", [None, "", "  "])
def test_missing_data_is_refused_listing_the_builtin_sets(task, builtin, data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.yaml").write_text("path: .\ntrain: a\nval: b\nnames: [x]\n")   # "" must not find it
    with pytest.raises(ValueError) as e:
        get_task(task).resolve_data(data)
    assert str(e.value).startswith("data is required: a dataset YAML/folder, or a built-in set by name "
                                   f"({builtin})")


# ---- Defect 15: COCO boxes entirely outside the image ---------------------------------------------


def _coco(root: Path, annotations: list[dict]) -> Path:
    for folder, name, (w, h) in (("train2017", "a.jpg", (100, 50)), ("val2017", "c.jpg", (60, 40))):
        (root / folder).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((h, w, 3), 77, np.uint8)).save(root / folder / name)
    cats = [{"id": 7, "name": "dog"}]
    docs = {"train": {"images": [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 50}],
                      "annotations": annotations, "categories": cats},
            "val": {"images": [{"id": 5, "file_name": "c.jpg", "width": 60, "height": 40}],
                    "annotations": [{"id": 1, "image_id": 5, "category_id": 7, "bbox": [30, 20, 30, 20]}],
                    "categories": cats}}
    (root / "annotations").mkdir(exist_ok=True)
    for split, doc in docs.items():
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))
    y = root / "coco.yaml"
    y.write_text("format: coco\npath: .\n"
                 "train: {images: train2017, annotations: annotations/instances_train.json}\n"
                 "val: {images: val2017, annotations: annotations/instances_val.json}\n")
    return y


def test_coco_boxes_outside_the_image_are_reported_with_their_ids(tmp_path, caplog):
    anns = [{"id": 10, "image_id": 1, "category_id": 7, "bbox": [10, 5, 20, 10]},
            {"id": 30, "image_id": 1, "category_id": 7, "bbox": [-50, -50, 30, 30]},   # above-left of the image
            {"id": 31, "image_id": 1, "category_id": 7, "bbox": [120, 10, 5, 5]},      # right of it
            {"id": 32, "image_id": 1, "category_id": 7, "bbox": [-5, -5, 10, 10]},     # partly inside: clipped
            {"id": 33, "image_id": 1, "category_id": 7, "bbox": [5, 5, 0, 10]}]        # zero width
    with caplog.at_level("WARNING", logger="libreyolo"):
        cfg = resolve_data(_coco(tmp_path, anns))
    np.testing.assert_allclose(cfg.train[0].labels, [[0, 0.1, 0.1, 0.3, 0.3], [0, 0, 0, 0.05, 0.1]], atol=1e-6)
    msgs = _warnings(caplog)
    outside = [m for m in msgs if "entirely outside" in m]
    assert len(outside) == 1, msgs
    assert outside[0].startswith("annotations/instances_train.json: skipped 2 annotation(s) lying entirely "
                                 "outside their image: annotations[1] (id 30) bbox [-50, -50, 30, 30] on image 1 "
                                 "(100x50), annotations[2] (id 31)")
    zero = [m for m in msgs if "zero or negative" in m]
    assert zero == [("annotations/instances_train.json: skipped 1 annotation(s) with zero or negative width/height: "
                     "annotations[4] (id 33)")]


def test_yolo_row_entirely_outside_within_the_tolerance_is_a_problem(tmp_path):
    for split in ("train", "val"):
        _jpeg(tmp_path / "images" / split / "a.jpg")
        (tmp_path / "labels" / split).mkdir(parents=True)
    (tmp_path / "labels/train/a.txt").write_text("0 1.0005 0.5 0.0009 0.2\n")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a]\n")
    with pytest.raises(ValueError, match=r"labels/train/a.txt line 1: box cx=1.0005 .* lies entirely outside "
                                         "the image"):
        resolve_data(tmp_path / "data.yaml")


# ---- Defect 5: tensors without data --------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("shape", [(3, 8, 8), (2, 3, 8, 8)])
@pytest.mark.parametrize("resolve", ["load_sources", "pending_sources", "stream_sources"])
def test_meta_tensors_are_refused_naming_index_shape_and_device(dtype, shape, resolve):
    t = torch.empty(shape, dtype=dtype, device="meta")
    with pytest.raises(ValueError) as e:
        getattr(sources, resolve)([np.zeros((4, 4, 3), np.uint8), t])
    msg = str(e.value)
    assert msg.startswith(f"source[1] (torch tensor with shape {shape} and dtype {dtype}) is on the 'meta' device")
    assert "no values" in msg


# ---- Defect 2: stream=True decodes lazily; unreadable files in a folder are skipped -------------


@pytest.fixture(scope="module")
def model():
    return LibreYOLO.new("yolox", "n", device="cpu", seed=0)


@pytest.fixture
def decoded(monkeypatch):
    """The paths the CPU decoder was called on, in order (the decoder itself still runs)."""
    calls: list[str] = []
    real = sources.decode_image

    def counting(path):
        calls.append(Path(path).name)
        return real(path)
    monkeypatch.setattr(sources, "decode_image", counting)
    return calls


def test_stream_yields_the_first_result_before_the_later_files_are_decoded(model, tmp_path, decoded):
    n = 24
    for i in range(n):
        _jpeg(tmp_path / f"{i:02d}.jpg", seed=i)
    listed = model.predict(tmp_path, imgsz=SIZE, batch=2)
    assert len(decoded) == n
    decoded.clear()
    gen = model.predict(tmp_path, imgsz=SIZE, batch=2, stream=True)
    assert decoded == []   # nothing decoded before the first result is asked for
    first = next(gen)
    assert first.path == str(tmp_path / "00.jpg")
    # the overlapped loop holds three chunks (finishing, running, prepared) plus the files decoded
    # ahead: bounded whatever the folder's size
    assert len(decoded) <= 3 * 2 + sources.STREAM_AHEAD < n, decoded
    rest = list(gen)
    assert len(decoded) == n
    got = [first, *rest]
    assert [r.path for r in got] == [r.path for r in listed]
    for a, b in zip(got, listed):   # stream=True gives what the list gives
        assert torch.equal(a.boxes.data, b.boxes.data)


def test_stream_sources_keeps_at_most_ahead_files_decoded(tmp_path, decoded):
    for i in range(10):
        _jpeg(tmp_path / f"{i}.jpg", seed=i)
    stream = sources.stream_sources(tmp_path, workers=2, ahead=3)
    assert len(stream) == 10 and decoded == []
    it = iter(stream)
    for k in range(1, 5):
        next(it)
        assert len(decoded) <= k + 3
    it.close()   # abandoning it stops the decode threads: no further file is started
    started = len(decoded)
    assert started <= 4 + 3
    assert len(decoded) == started


@pytest.mark.parametrize("stream", [False, True])
def test_unreadable_file_in_a_folder_is_one_warning_and_the_others_go_on(model, tmp_path, caplog, stream):
    for i in range(4):
        _jpeg(tmp_path / f"{i}.jpg", seed=i)
    (tmp_path / "1.jpg").write_bytes(b"not an image")
    with caplog.at_level("WARNING", logger="libreyolo"):
        got = list(model.predict(tmp_path, imgsz=SIZE, stream=stream))
    assert [Path(r.path).name for r in got] == ["0.jpg", "2.jpg", "3.jpg"]
    skips = [m for m in _warnings(caplog) if "skipping" in m]
    assert len(skips) == 1 and f"'{tmp_path / '1.jpg'}'" in skips[0] and "strict=True" in skips[0]
    # the same from a glob pattern
    caplog.clear()
    with caplog.at_level("WARNING", logger="libreyolo"):
        got = list(model.predict(str(tmp_path / "*.jpg"), imgsz=SIZE, stream=stream))
    assert len(got) == 3 and len([m for m in _warnings(caplog) if "skipping" in m]) == 1


def test_strict_stops_at_the_unreadable_file_after_the_results_before_it(model, tmp_path):
    for i in range(4):
        _jpeg(tmp_path / f"{i}.jpg", seed=i)
    (tmp_path / "2.jpg").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"cannot decode image '.*2\.jpg'"):
        model.predict(tmp_path, imgsz=SIZE, strict=True)
    seen = []
    with pytest.raises(ValueError, match=r"cannot decode image '.*2\.jpg'"):
        for r in model.predict(tmp_path, imgsz=SIZE, stream=True, strict=True):
            seen.append(Path(r.path).name)
    assert seen == ["0.jpg", "1.jpg"]


def test_a_file_named_directly_still_raises_and_an_all_broken_folder_is_an_error(model, tmp_path):
    good = _jpeg(tmp_path / "good.jpg")
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    for stream in (False, True):
        with pytest.raises(ValueError, match=r"cannot decode image '.*bad\.jpg'"):
            list(model.predict([good, bad], imgsz=SIZE, stream=stream))
    folder = tmp_path / "broken"
    folder.mkdir()
    for i in range(2):
        (folder / f"{i}.jpg").write_bytes(b"junk")
    for stream in (False, True):
        with pytest.raises(ValueError, match=r"none of the 2 image file\(s\) in '.*broken' could be decoded"):
            list(model.predict(folder, imgsz=SIZE, stream=stream))


def test_pending_items_of_the_gpu_decode_path_skip_alike(model, tmp_path, caplog):
    """The GPU decode's chunks load non-JPEG / refused files on the CPU in _prepare_staged: the
    same skip rule (here on the CPU, where no upload ring exists)."""
    _jpeg(tmp_path / "0.jpg")
    (tmp_path / "1.jpg").write_bytes(b"junk")
    pend = pending_sources(tmp_path)
    p = model.get_predictor()
    with caplog.at_level("WARNING", logger="libreyolo"):
        ch = p._prepare_staged(pend, strict=False)
        assert [Path(it.name).name for it in ch.items] == ["0.jpg"] and len(ch.images) == 1
        assert p._prepare_staged(pend[1:], strict=False) is None
    assert len([m for m in _warnings(caplog) if "skipping" in m]) == 2
    with pytest.raises(ValueError, match=r"cannot decode image '.*1\.jpg'"):
        p._prepare_staged(pend, strict=True)


def test_strict_is_a_checked_predict_option(model, tmp_path):
    _jpeg(tmp_path / "a.jpg")
    with pytest.raises(ValueError, match="strict"):
        model.predict(tmp_path, imgsz=SIZE, strict="maybe")
