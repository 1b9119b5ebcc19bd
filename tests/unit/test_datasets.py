"""resolve_data: YOLO and COCO parsing, every validation error, the one-error listing, the cache."""

from __future__ import annotations

import json
import os
import pathlib
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import libreyolo.data.datasets as datasets
from libreyolo.data.datasets import DatasetConfig, Sample, label_path_for, resolve_data

# ---- helpers --------------------------------------------------------------------------------------


def write_image(path: Path, w: int = 40, h: int = 30, fmt: str | None = None, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), 77, np.uint8)).save(path, format=fmt, **kw)
    return path


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_yaml(path: Path, text: str) -> Path:
    return write_text(path, text)


def yolo_dataset(root: Path, labels: dict[str, str | None], *, nc: int = 5,
                 extra: str = "") -> Path:
    """Images under root/images/<split>/<name>.png, labels from ``labels`` (None = no file)."""
    for rel, text in labels.items():
        split, name = rel.split("/")
        write_image(root / "images" / split / f"{name}.png")
        if text is not None:
            write_text(root / "labels" / split / f"{name}.txt", text)
    names = ", ".join(f"c{i}" for i in range(nc))
    return write_yaml(root / "data.yaml", f"path: .\ntrain: images/train\nval: images/val\n"
                                          f"names: [{names}]\n{extra}")


GOOD = {"train/a": "0 0.5 0.5 0.2 0.4\n1 0.25 0.25 0.1 0.1\n", "train/b": "", "train/c": None,
        "val/v": "4 0.5 0.5 1 1\n"}


def problems_of(excinfo) -> list[str]:
    return [line[4:] for line in str(excinfo.value).splitlines() if line.startswith("  - ")]


# ---- YOLO parsing ----------------------------------------------------------------------------------


def test_yolo_dirs_names_list_and_conversion(tmp_path):
    cfg = resolve_data(yolo_dataset(tmp_path, GOOD))
    assert isinstance(cfg, DatasetConfig) and cfg.format == "yolo"
    assert cfg.root == tmp_path and cfg.nc == 5 and cfg.names == {i: f"c{i}" for i in range(5)}
    assert cfg.source == str(tmp_path / "data.yaml")
    assert [s.image.name for s in cfg.train] == ["a.png", "b.png", "c.png"]
    a = cfg.train[0]
    assert isinstance(a, Sample) and (a.width, a.height) == (40, 30)
    assert a.labels.dtype == np.float32 and a.labels.shape == (2, 5)
    np.testing.assert_allclose(a.labels, [[0, 0.4, 0.3, 0.6, 0.7], [1, 0.2, 0.2, 0.3, 0.3]],
                               atol=1e-6)
    assert cfg.train[1].labels.shape == (0, 5)  # empty file
    assert cfg.train[2].labels.shape == (0, 5)  # no file
    np.testing.assert_allclose(cfg.val[0].labels, [[4, 0, 0, 1, 1]])


def test_folder_holding_data_yaml_and_nested_image_dirs(tmp_path):
    yolo_dataset(tmp_path, GOOD)
    write_image(tmp_path / "images" / "train" / "sub" / "deep.png")
    write_text(tmp_path / "labels" / "train" / "sub" / "deep.txt", "2 0.5 0.5 0.5 0.5\n")
    cfg = resolve_data(tmp_path)
    deep = [s for s in cfg.train if s.image.name == "deep.png"]
    assert len(deep) == 1 and deep[0].labels[0, 0] == 2


def test_names_forms(tmp_path):
    (tmp_path / "images/train").mkdir(parents=True)
    write_image(tmp_path / "images/train/a.png")
    base = "path: .\ntrain: images/train\nval: images/train\n"
    cases = {
        "names: {0: cat, 1: dog}\n": {0: "cat", 1: "dog"},
        "names: {'1': dog, '0': cat}\n": {0: "cat", 1: "dog"},
        "nc: 3\n": {0: "class0", 1: "class1", 2: "class2"},
        "nc: 2\nnames: [cat, dog]\n": {0: "cat", 1: "dog"},
    }
    for i, (text, names) in enumerate(cases.items()):
        cfg = resolve_data(write_yaml(tmp_path / f"d{i}.yaml", base + text))
        assert cfg.names == names and cfg.nc == len(names)
    for text, msg in [("nc: 3\nnames: [a, b]\n", "nc=3 but 2 names"),
                      ("names: {0: a, 2: b}\n", "without gaps"), ("", "give 'names'")]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            resolve_data(write_yaml(tmp_path / "bad.yaml", base + text))


def test_relative_path_is_relative_to_the_yaml(tmp_path):
    yolo_dataset(tmp_path / "ds", GOOD)
    y = write_yaml(tmp_path / "cfg" / "my.yaml", "path: ../ds\ntrain: images/train\n"
                   "val: images/val\nnames: [a, b, c, d, e]\n")
    cfg = resolve_data(y)
    assert cfg.root == tmp_path / "ds" and len(cfg.train) == 3


def test_txt_lists_and_lists_of_entries(tmp_path):
    yolo_dataset(tmp_path, GOOD)
    write_image(tmp_path / "extra" / "images" / "e.png")
    write_text(tmp_path / "extra" / "labels" / "e.txt", "3 0.5 0.5 0.2 0.2\n")
    write_text(tmp_path / "train.txt",
               "images/train/a.png\n\n# comment\n"  # relative to the root
               f"{tmp_path / 'images/train/b.png'}\n"  # absolute
               "./extra/images/e.png\n")  # ./ relative to the list (= root here)
    write_text(tmp_path / "lists" / "val.txt", "../images/val/v.png\n")  # relative to the list
    y = write_yaml(tmp_path / "l.yaml", "path: .\ntrain: [train.txt, images/train]\n"
                   "val: lists/val.txt\nnames: [a, b, c, d, e]\n")
    cfg = resolve_data(y)
    assert [s.image.name for s in cfg.train] == ["a.png", "b.png", "e.png", "a.png", "b.png", "c.png"]
    assert cfg.train[2].labels[0, 0] == 3
    assert [s.image.name for s in cfg.val] == ["v.png"]


def test_label_path_rule():
    assert label_path_for(Path("/d/images/x/images/train/a.jpg")) == Path("/d/images/x/labels/train/a.txt")
    assert label_path_for(Path("/d/imgs/a.b.png")) == Path("/d/imgs/a.b.txt")
    assert label_path_for(Path("/d/images/a.JPG")) == Path("/d/labels/a.txt")


def test_exif_rotated_image_size_is_upright(tmp_path):
    yolo_dataset(tmp_path, GOOD)
    exif = Image.Exif()
    exif[274] = 6  # rotated 90 degrees: decoded upright as 30 x 40
    write_image(tmp_path / "images/train/r.jpg", 40, 30, exif=exif.tobytes())
    cfg = resolve_data(tmp_path / "data.yaml")
    (r,) = [s for s in cfg.train if s.image.name == "r.jpg"]
    assert (r.width, r.height) == (30, 40)


def test_tolerance_clips_and_duplicates_drop(tmp_path):
    labels = dict(GOOD, **{"train/a": "0 1.0005 0.5 0.2 0.2\n1 0.1 0.1 0.4 0.4\n1 0.1 0.1 0.4 0.4\n"})
    cfg = resolve_data(yolo_dataset(tmp_path, labels))
    lab = cfg.train[0].labels
    assert lab.shape == (2, 5) and lab[:, 1:].min() >= 0 and lab[:, 1:].max() <= 1
    np.testing.assert_allclose(lab[0], [0, 0.9005, 0.4, 1.0, 0.6], atol=1e-6)


# ---- structural errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("text, key", [
    ("train: images/train\nval: images/val\nnames: [a]\n", "'path'"),
    ("path: .\nval: images/val\nnames: [a]\n", "'train'"),
    ("path: .\ntrain: images/train\nnames: [a]\n", "'val'"),
])
def test_missing_entries(tmp_path, text, key):
    with pytest.raises(FileNotFoundError, match=f"required entry {key} is missing"):
        resolve_data(write_yaml(tmp_path / "d.yaml", text))


def test_missing_folders_name_key_and_path(tmp_path):
    yolo_dataset(tmp_path, GOOD)
    y = write_yaml(tmp_path / "a.yaml", "path: nowhere\ntrain: images/train\nval: images/val\nnc: 5\n")
    with pytest.raises(FileNotFoundError, match=re.escape(f"'path' folder not found: {tmp_path / 'nowhere'}")):
        resolve_data(y)
    y = write_yaml(tmp_path / "b.yaml", "path: .\ntrain: images/train\nval: images/missing\nnc: 5\n")
    with pytest.raises(FileNotFoundError, match=re.escape(f"'val' not found: {tmp_path / 'images/missing'}")):
        resolve_data(y)
    y = write_yaml(tmp_path / "c.yaml", "path: .\ntrain: [images/train, x.txt]\nval: images/val\nnc: 5\n")
    with pytest.raises(FileNotFoundError, match=re.escape(f"'train[1]' not found: {tmp_path / 'x.txt'}")):
        resolve_data(y)
    with pytest.raises(FileNotFoundError, match="dataset not found"):
        resolve_data(tmp_path / "none.yaml")


# ---- content errors --------------------------------------------------------------------------------


NORMALIZED = "(coordinates must be normalized by the image size)"


@pytest.mark.parametrize("row, message", [
    ("7 0.5 0.5 0.1 0.1", "class 7 out of range for nc=5"),
    ("0 0.5 0.5 0.1", "expected 5 values 'class cx cy w h', got 4"),
    ("0 0.5 0.5 0.1 0.1 0.3 0.3",
     "expected 5 values 'class cx cy w h', got 7 (an instance-segmentation polygon row: polygon labels train "
     "a segment model, e.g. LibreYOLO.new('rtmdet', 't', task='segment'))"),
    ("0 0.5 abc 0.1 0.1", "'abc' is not a number"),
    ("1.5 0.5 0.5 0.1 0.1", "class '1.5' is not a non-negative integer"),
    ("0 -0.01 0.5 0.1 0.1", f"cx=-0.01 outside [0, 1] {NORMALIZED}"),
    ("0 0.5 0.5 1.2 0.1", f"w=1.2 outside [0, 1] {NORMALIZED}"),
    ("0 0.5 0.5 0 0.1", "zero or negative box size w=0 h=0.1"),
    ("0 0.5 0.5 0.1 -0.2", "zero or negative box size w=0.1 h=-0.2"),
    ("0 0.5 nan 0.1 0.1", "non-finite value"),
])
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    labels = dict(GOOD, **{"train/x": f"0 0.5 0.5 0.1 0.1\n\n{row}\n"})
    with pytest.raises(ValueError) as e:
        resolve_data(yolo_dataset(tmp_path, labels))
    assert problems_of(e) == [f"labels/train/x.txt line 3: {message}"]


def test_undecodable_image_is_named(tmp_path):
    yolo_dataset(tmp_path, GOOD)
    write_text(tmp_path / "images/val/broken.jpg", "this is not a jpeg")
    png = write_image(tmp_path / "images/val/trunc.png")
    png.write_bytes(png.read_bytes()[:-20])  # verify() checks PNG chunk CRCs
    with pytest.raises(ValueError) as e:
        resolve_data(tmp_path / "data.yaml")
    found = problems_of(e)
    assert len(found) == 2
    assert found[0].startswith("images/val/broken.jpg: cannot decode image")
    assert found[1].startswith("images/val/trunc.png: cannot decode image")


def test_missing_listed_image_and_empty_split(tmp_path):
    yolo_dataset(tmp_path, GOOD)
    write_text(tmp_path / "train.txt", "images/train/a.png\nimages/train/gone.png\n")
    (tmp_path / "images/empty").mkdir()
    y = write_yaml(tmp_path / "l.yaml", "path: .\ntrain: train.txt\nval: images/empty\nnc: 5\n")
    with pytest.raises(ValueError) as e:
        resolve_data(y)
    assert problems_of(e) == [
        f"train.txt line 2: image not found: {tmp_path / 'images/train/gone.png'}",
        "val: no images found in 'images/empty'",
    ]


def test_one_error_lists_many_problems_across_splits(tmp_path):
    labels = dict(GOOD)
    for i in range(24):
        labels[f"train/bad{i:02d}"] = "9 0.5 0.5 0.1 0.1\n"
    labels["val/badval"] = "0 0.5\n"
    with pytest.raises(ValueError) as e:
        resolve_data(yolo_dataset(tmp_path, labels))
    text = str(e.value)
    assert text.splitlines()[0].startswith(f"dataset '{tmp_path / 'data.yaml'}' has 25 problems")
    found = problems_of(e)
    assert len(found) == datasets.MAX_LISTED_PROBLEMS == 20
    assert found[0] == "labels/train/bad00.txt line 1: class 9 out of range for nc=5"
    assert text.splitlines()[-1] == "  ... and 5 more"
    # the val problem is among the ones counted: with a larger limit it is listed too
    with pytest.raises(ValueError) as e:
        datasets.MAX_LISTED_PROBLEMS = 50
        try:
            resolve_data(tmp_path / "data.yaml")
        finally:
            datasets.MAX_LISTED_PROBLEMS = 20
    assert problems_of(e)[-1].startswith("labels/val/badval.txt line 1: expected 5 values")


# ---- COCO -------------------------------------------------------------------------------------------


def coco_dataset(root: Path, train: dict | None = None, val: dict | None = None) -> Path:
    write_image(root / "train2017" / "a.jpg", 100, 50)
    write_image(root / "train2017" / "b.jpg", 80, 80)
    write_image(root / "val2017" / "c.jpg", 60, 40)
    cats = [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}]
    train = train or {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 50},
                   {"id": 2, "file_name": "b.jpg", "width": 80, "height": 80}],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 7, "bbox": [10, 5, 20, 10], "iscrowd": 0},
            {"id": 11, "image_id": 1, "category_id": 3, "bbox": [0, 0, 100, 50]},
            {"id": 12, "image_id": 1, "category_id": 3, "bbox": [1, 1, 5, 5], "iscrowd": 1},
        ],
        "categories": cats,
    }
    val = val or {"images": [{"id": 5, "file_name": "c.jpg", "width": 60, "height": 40}],
                  "annotations": [{"id": 1, "image_id": 5, "category_id": 3, "bbox": [30, 20, 30, 20]}],
                  "categories": cats}
    write_text(root / "annotations" / "instances_train.json", json.dumps(train))
    write_text(root / "annotations" / "instances_val.json", json.dumps(val))
    return write_yaml(root / "coco.yaml", "format: coco\npath: .\n"
                      "train: {images: train2017, annotations: annotations/instances_train.json}\n"
                      "val: {images: val2017, annotations: annotations/instances_val.json}\n")


def test_coco_parsing(tmp_path):
    cfg = resolve_data(coco_dataset(tmp_path))
    assert cfg.format == "coco" and cfg.nc == 2 and cfg.names == {0: "cat", 1: "dog"}  # sorted ids
    a, b = cfg.train
    assert (a.width, a.height, b.width, b.height) == (100, 50, 80, 80)
    np.testing.assert_allclose(a.labels, [[1, 0.1, 0.1, 0.3, 0.3], [0, 0, 0, 1, 1]], atol=1e-6)
    assert b.labels.shape == (0, 5)  # an image without annotations is kept as background
    np.testing.assert_allclose(cfg.val[0].labels, [[0, 0.5, 0.5, 1, 1]])
    assert (tmp_path / "annotations" / "train.libreyolo.cache").is_file()
    again = resolve_data(tmp_path / "coco.yaml")
    np.testing.assert_array_equal(again.train[0].labels, a.labels)


def test_coco_malformed_json_lists_everything(tmp_path):
    y = coco_dataset(tmp_path)
    train = json.loads((tmp_path / "annotations/instances_train.json").read_text())
    train["annotations"] += [
        {"id": 20, "image_id": 99, "category_id": 7, "bbox": [1, 1, 2, 2]},
        {"id": 21, "image_id": 1, "category_id": 5, "bbox": [1, 1, 2, 2]},
        {"id": 22, "image_id": 1, "category_id": 7, "bbox": [1, 1, 2]},
        {"id": 23, "image_id": 1, "bbox": [1, 1, 2, 2]},
    ]
    train["images"].append({"id": 3, "file_name": "gone.jpg", "width": 10, "height": 10})
    train["images"].append({"id": 4, "file_name": "bad.jpg", "width": 10, "height": 10})
    write_text(tmp_path / "train2017/bad.jpg", "not an image")
    write_text(tmp_path / "annotations/instances_train.json", json.dumps(train))
    write_text(tmp_path / "annotations/instances_val.json", json.dumps({"images": []}))
    with pytest.raises(ValueError) as e:
        resolve_data(y)
    j = "annotations/instances_train.json"
    assert problems_of(e) == [
        "annotations/instances_val.json: missing or non-list key(s) annotations, categories",
        f"{j}: annotations[3] (id 20): unknown image_id 99",
        f"{j}: annotations[4] (id 21): unknown category_id 5",
        f"{j}: annotations[5] (id 22): bbox must be 4 numbers [x, y, w, h], got [1, 1, 2]",
        f"{j}: annotations[6] (id 23): needs 'image_id', 'category_id' and 'bbox'",
        f"{j}: image not found: {tmp_path / 'train2017/gone.jpg'}",
        "train2017/bad.jpg: cannot decode image (UnidentifiedImageError: cannot identify image file "
        f"'{tmp_path / 'train2017/bad.jpg'}')",
    ]
    assert not (tmp_path / "annotations/train.libreyolo.cache").exists()


def test_coco_size_mismatch_and_missing_folders(tmp_path):
    y = coco_dataset(tmp_path)
    train = json.loads((tmp_path / "annotations/instances_train.json").read_text())
    train["images"][1]["width"] = 81
    write_text(tmp_path / "annotations/instances_train.json", json.dumps(train))
    with pytest.raises(ValueError, match=re.escape("image id 2: json says 81x80 but train2017/b.jpg is 80x80")):
        resolve_data(y)
    write_yaml(y, "format: coco\npath: .\ntrain: {images: nope, annotations: a.json}\n"
               "val: {images: val2017, annotations: annotations/instances_val.json}\n")
    with pytest.raises(FileNotFoundError, match=re.escape(f"'train.images' folder not found: {tmp_path / 'nope'}")):
        resolve_data(y)
    write_yaml(y, "format: coco\npath: .\ntrain: {images: train2017}\nval: {images: val2017}\n")
    with pytest.raises(FileNotFoundError, match=re.escape("'train.annotations' is missing")):
        resolve_data(y)


# ---- cache ------------------------------------------------------------------------------------------


def test_cache_hit_reads_no_label_file_and_verifies_no_image(tmp_path, monkeypatch):
    y = yolo_dataset(tmp_path, GOOD)
    first = resolve_data(y)
    assert (tmp_path / "labels" / "train.libreyolo.cache").is_file()
    assert (tmp_path / "labels" / "val.libreyolo.cache").is_file()

    def forbidden(*a, **k):
        raise AssertionError("parsed although the cache is valid")

    read = []
    real_read_text = pathlib.Path.read_text
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: read.append(self) or real_read_text(self, *a, **k))
    monkeypatch.setattr(datasets, "_parse_yolo_label_file", forbidden)
    monkeypatch.setattr(datasets, "_inspect_image", forbidden)
    monkeypatch.setattr(datasets.Image, "open", forbidden)
    second = resolve_data(y)
    assert read == [y]  # only the YAML
    for a, b in zip(first.train + first.val, second.train + second.val):
        assert (a.image, a.width, a.height) == (b.image, b.width, b.height)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert b.labels.dtype == np.float32


def test_cache_invalidated_by_a_changed_label_or_a_new_image(tmp_path, monkeypatch):
    y = yolo_dataset(tmp_path, GOOD)
    resolve_data(y)
    calls = []
    real = datasets._parse_yolo_label_file
    monkeypatch.setattr(datasets, "_parse_yolo_label_file", lambda p, *a: calls.append(p) or real(p, *a))
    lab = tmp_path / "labels/train/b.txt"
    lab.write_text("3 0.5 0.5 0.5 0.5\n")
    os.utime(lab, ns=(1, 1))  # different size and mtime
    cfg = resolve_data(y)
    assert lab in calls and len(calls) == 3  # train re-parsed, val served from its cache
    np.testing.assert_allclose(cfg.train[1].labels, [[3, 0.25, 0.25, 0.75, 0.75]])
    calls.clear()
    write_image(tmp_path / "images/val/w.png")
    cfg = resolve_data(y)
    assert len(calls) == 2 and len(cfg.val) == 2
    calls.clear()
    resolve_data(y)
    assert calls == []


def test_cache_not_written_for_a_split_with_problems(tmp_path):
    labels = dict(GOOD, **{"val/v": "9 0.5 0.5 0.1 0.1\n"})
    with pytest.raises(ValueError):
        resolve_data(yolo_dataset(tmp_path, labels))
    assert (tmp_path / "labels/train.libreyolo.cache").is_file()
    assert not (tmp_path / "labels/val.libreyolo.cache").exists()


def test_cache_falls_back_to_the_root_when_labels_dir_is_not_writable(tmp_path, monkeypatch):
    y = yolo_dataset(tmp_path, GOOD)
    real = datasets.tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
        if Path(dir) == tmp_path / "labels":
            raise PermissionError("read-only")
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(datasets.tempfile, "mkstemp", mkstemp)
    resolve_data(y)
    assert (tmp_path / "train.libreyolo.cache").is_file()
    assert not (tmp_path / "labels/train.libreyolo.cache").exists()
    assert not [p for p in tmp_path.rglob("*.tmp")]
    monkeypatch.setattr(datasets, "_parse_yolo_label_file", lambda *a: (_ for _ in ()).throw(AssertionError))
    resolve_data(y)  # served from the root cache


def test_corrupt_cache_is_ignored_and_rewritten(tmp_path):
    y = yolo_dataset(tmp_path, GOOD)
    resolve_data(y)
    cache = tmp_path / "labels/train.libreyolo.cache"
    cache.write_bytes(b"garbage")
    assert len(resolve_data(y).train) == 3
    with np.load(cache, allow_pickle=False) as z:
        assert int(z["counts"].sum()) == 2


# ---- decoding check, byte-order marks ---------------------------------------------------------------


def truncated_jpeg(path: Path, w: int = 96, h: int = 64) -> Path:
    """A JPEG cut in the middle of its entropy-coded data: Image.verify() accepts it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    noise = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path, quality=90)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with Image.open(path) as im:
        im.verify()  # the old check passed it
    return path


def test_truncated_jpegs_in_both_splits_are_reported_up_front_with_the_other_problems(tmp_path):
    labels = dict(GOOD, **{"train/badrow": "0 0.5\n"})
    yolo_dataset(tmp_path, labels)
    truncated_jpeg(tmp_path / "images/train/cut.jpg")
    truncated_jpeg(tmp_path / "images/val/cutval.jpg")
    with pytest.raises(ValueError) as e:
        resolve_data(tmp_path / "data.yaml")
    found = problems_of(e)
    assert len(found) == 3
    assert found[0].startswith("labels/train/badrow.txt line 1: expected 5 values")
    assert found[1].startswith("images/train/cut.jpg: cannot decode image (OSError: image file is truncated")
    assert found[2].startswith("images/val/cutval.jpg: cannot decode image (OSError: image file is truncated")
    assert not (tmp_path / "labels" / "train.libreyolo.cache").exists()
    assert not (tmp_path / "labels" / "val.libreyolo.cache").exists()


def test_truncated_jpeg_in_a_coco_split_is_reported(tmp_path):
    y = coco_dataset(tmp_path)
    truncated_jpeg(tmp_path / "val2017" / "c.jpg", 60, 40)
    with pytest.raises(ValueError) as e:
        resolve_data(y)
    assert problems_of(e) == [f"val2017/c.jpg: cannot decode image (OSError: image file is truncated "
                              f"{problems_of(e)[0].split('truncated ', 1)[1]}"]


def test_jpeg_check_decodes_at_one_eighth_scale(tmp_path, monkeypatch):
    """The check asks libjpeg for a reduced decode of JPEGs; other formats decode in full."""
    y = yolo_dataset(tmp_path, GOOD)
    write_image(tmp_path / "images/train/big.jpg", 320, 240)
    drafts = []
    from PIL.JpegImagePlugin import JpegImageFile
    real = JpegImageFile.draft

    def spy(self, mode, size):
        drafts.append((self.format, self.size, size))
        return real(self, mode, size)

    monkeypatch.setattr(JpegImageFile, "draft", spy)
    cfg = resolve_data(y)
    assert drafts == [("JPEG", (320, 240), (40, 30))]
    big = next(s for s in cfg.train if s.image.name == "big.jpg")
    assert (big.width, big.height) == (320, 240)  # the full size, not the draft's


def test_old_cache_version_is_checked_again(tmp_path, monkeypatch):
    """A cache written by a release whose check did not decode images (verify() only) may hold a
    truncated JPEG: the new version string makes it be checked again."""
    y = yolo_dataset(tmp_path, GOOD)
    truncated_jpeg(tmp_path / "images/val/late.jpg")

    def verify_only(path, problems, found):  # the old check
        with Image.open(path) as im:
            size = im.size
            im.verify()
        return size

    with monkeypatch.context() as old:
        old.setattr(datasets, "_CACHE_VERSION", "libreyolo-labels-v1")
        old.setattr(datasets, "_inspect_image", verify_only)
        assert len(resolve_data(y).val) == 2  # accepted, and cached
    assert (tmp_path / "labels" / "val.libreyolo.cache").is_file()
    with pytest.raises(ValueError, match="late.jpg: cannot decode image"):
        resolve_data(y)


def test_label_file_with_a_utf8_bom(tmp_path):
    y = yolo_dataset(tmp_path, GOOD)
    (tmp_path / "labels/train/a.txt").write_bytes("\ufeff0 0.5 0.5 0.2 0.4\n1 0.5 0.5 0.2 0.2\n".encode())
    (tmp_path / "labels/train/b.txt").write_bytes(b"\xef\xbb\xbf")  # a BOM and nothing else: no objects
    # two files concatenated with `cat`: a BOM at the start of a later line
    (tmp_path / "labels/val/v.txt").write_bytes("\ufeff4 0.5 0.5 1 1\n\ufeff2 0.5 0.5 0.5 0.5\n".encode())
    cfg = resolve_data(y)
    a = next(s for s in cfg.train if s.image.stem == "a")
    np.testing.assert_allclose(a.labels[:, 0], [0, 1])
    assert len(next(s for s in cfg.train if s.image.stem == "b").labels) == 0
    np.testing.assert_allclose(cfg.val[0].labels[:, 0], [4, 2])


def test_label_file_in_utf16(tmp_path):
    y = yolo_dataset(tmp_path, GOOD)
    (tmp_path / "labels/val/v.txt").write_bytes("3 0.5 0.5 1 1\r\n".encode("utf-16"))  # with its BOM
    np.testing.assert_allclose(resolve_data(y).val[0].labels[:, 0], [3])


def test_yaml_json_and_list_files_with_a_bom(tmp_path):
    yolo_dataset(tmp_path, GOOD)
    (tmp_path / "train.txt").write_bytes("\ufeffimages/train/a.png\n".encode())
    y = tmp_path / "bom.yaml"
    y.write_bytes("\ufeffpath: .\ntrain: train.txt\nval: images/val\nnc: 5\n".encode())
    assert [s.image.name for s in resolve_data(y).train] == ["a.png"]
    c = coco_dataset(tmp_path / "coco")
    ann = tmp_path / "coco/annotations/instances_val.json"
    ann.write_bytes(b"\xef\xbb\xbf" + ann.read_bytes())
    assert len(resolve_data(c).val) == 1
