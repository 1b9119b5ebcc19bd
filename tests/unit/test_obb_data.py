"""Oriented-box data: YOLO-OBB and DOTA-style rows, bad rows reported together by file and line,
the built-in shapes-obb set (deterministic), samples through the model's letterbox."""
import math

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo.ops.preprocess import Preprocess
from libreyolo.tasks.obb.data import ObbDataset, collate_obb, parse_obb_labels, resolve_obb_data
from libreyolo.tasks.obb.synthetic import make_shapes_obb_dataset

NAMES = {0: "plane", 1: "ship"}


def test_yolo_obb_and_dota_rows_give_the_same_box():
    yolo = "1 0.1 0.2 0.5 0.2 0.5 0.4 0.1 0.4\n"
    dota = "imagesource:GoogleEarth\ngsd:0.1\n20 40 100 40 100 80 20 80 ship 0\n"
    a = parse_obb_labels(yolo, 2, NAMES, (200, 200), "a.txt")
    b = parse_obb_labels(dota, 2, NAMES, (200, 200), "b.txt")
    assert a[2] == [] and b[2] == []
    assert a[0].tolist() == b[0].tolist() == [1]
    assert np.allclose(a[1], b[1]) and a[1].shape == (1, 4, 2)


def test_bad_rows_are_named_by_file_and_line():
    text = ("0 0.1 0.1 0.5 0.1 0.5 0.5\n"              # 3 points
            "7 0.1 0.1 0.5 0.1 0.5 0.5 0.1 0.5\n"      # class out of range
            "20 40 100 40 100 80 20 80 car 0\n"        # DOTA with a name not in the dataset
            "0 0.1 0.1 1.5 0.1 1.5 0.5 0.1 0.5\n"      # outside the image
            "0 0.1 0.1 0.1 0.1 0.1 0.1 0.1 0.1\n"      # no area
            "0 0.1 0.1 0.5 0.1 0.5 0.5 0.1 0.5\n")     # fine
    cls, corners, problems = parse_obb_labels(text, 2, NAMES, (100, 100), "labels/x.txt")
    assert len(cls) == 1 and corners.shape == (1, 4, 2)
    assert problems[0].startswith("labels/x.txt:1: 7 values") and "3 points" in problems[0]
    assert problems[1].startswith("labels/x.txt:2: class 7")
    assert problems[2].startswith("labels/x.txt:3: class name 'car'")
    assert problems[3].startswith("labels/x.txt:4:") and "outside the image" in problems[3]
    assert problems[4].startswith("labels/x.txt:5:") and "no area" in problems[4]


def test_a_dataset_with_bad_labels_is_refused_with_every_problem(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "images" / split).mkdir(parents=True)
        (tmp_path / "labels" / split).mkdir(parents=True)
        Image.new("RGB", (32, 32)).save(tmp_path / "images" / split / "a.jpg")
    (tmp_path / "labels" / "train" / "a.txt").write_text("0 0.1 0.1 0.5 0.1 0.5 0.5\n")
    (tmp_path / "labels" / "val" / "a.txt").write_text("0 0.1 0.1 0.5 0.1 0.5 0.5 0.1 0.5 0.2 0.2\n")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [plane, ship]\n")
    with pytest.raises(ValueError) as e:
        resolve_obb_data(str(tmp_path / "data.yaml"))
    msg = str(e.value)
    assert "labels/train/a.txt:1" in msg and "labels/val/a.txt:1" in msg


def test_data_is_required():
    with pytest.raises(ValueError, match="shapes-obb"):
        resolve_obb_data(None)


def test_shapes_obb_is_deterministic_and_reads_back(tmp_path):
    a = make_shapes_obb_dataset(tmp_path / "a", n_train=4, n_val=2, imgsz=64, seed=3)
    b = make_shapes_obb_dataset(tmp_path / "b", n_train=4, n_val=2, imgsz=64, seed=3)
    la = sorted((a.parent / "labels").rglob("*.txt"))
    lb = sorted((b.parent / "labels").rglob("*.txt"))
    assert [p.read_text() for p in la] == [p.read_text() for p in lb] and len(la) == 6
    cfg = resolve_obb_data(str(a))
    assert cfg.nc == 2 and cfg.names == {0: "rectangle", 1: "ellipse"}
    assert len(cfg.train) == 4 and all(len(s.cls) >= 1 for s in cfg.train + cfg.val)
    assert all(((s.corners >= 0) & (s.corners <= 1)).all() for s in cfg.train)


def test_samples_follow_the_letterbox_and_collate_pads(tmp_path):
    img = np.zeros((50, 100, 3), np.uint8)
    img[10:30, 20:60] = 255
    path = tmp_path / "x.png"
    Image.fromarray(img).save(path)
    from libreyolo.tasks.obb.data import ObbSample
    corners = np.array([[[20, 10], [60, 10], [60, 30], [20, 30]]], np.float32) / np.array([100, 50], np.float32)
    s = ObbSample(path, (50, 100), np.array([1]), corners)
    prep = Preprocess("topleft", antialias=True, quantize=True)
    ds = ObbDataset([s], 64, prep)
    image, cls, boxes = ds[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 64, 64)
    expect = prep.resize_images(torch.from_numpy(img)[None], 64)[0]
    assert torch.equal(image, (expect * 255).round().to(torch.uint8))
    # the 100 x 50 image scales by 0.64 into the top-left of the 64 x 64 canvas
    assert np.allclose(boxes.numpy(), [[40 * 0.64 / 64, 20 * 0.64 / 64, 40 * 0.64 / 64, 20 * 0.64 / 64, 0.0]],
                       atol=1e-6)
    flipped = ObbDataset([s], 64, prep, augment=True, fliplr=1.0)[0][2]
    assert flipped[0, 0] == pytest.approx((100 - 40) * 0.64 / 64, abs=1e-6)
    assert flipped[0, 4] == pytest.approx(0.0, abs=1e-6) or flipped[0, 4] == pytest.approx(math.pi, abs=1e-6)
    batch = collate_obb([(image, cls, boxes), (image, cls[:0], boxes[:0])], bucket=4)
    assert [t.shape for t in batch[1:]] == [(2, 4), (2, 4, 5), (2, 4)]
    assert batch[3].tolist() == [[True, False, False, False], [False] * 4]
