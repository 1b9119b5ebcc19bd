"""The built-in shapes dataset: determinism, idempotence, atomicity, and labels that fit the pixels."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

import libreyolo.data.synthetic as synthetic
from libreyolo.data.datasets import resolve_data
from libreyolo.data.synthetic import SHAPE_NAMES, make_shapes_dataset, render_shapes

SMALL = dict(n_train=8, n_val=4, imgsz=96)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_yaml_and_manifest(tmp_path):
    y = make_shapes_dataset(tmp_path / "s", **SMALL)
    root = tmp_path / "s"
    assert y == root / "data.yaml"
    spec = yaml.safe_load(y.read_text())
    assert spec["path"] == "." and spec["train"] == "images/train" and spec["val"] == "images/val"
    assert spec["names"] == dict(enumerate(SHAPE_NAMES)) and spec["nc"] == 5
    assert len(list((root / "images/train").glob("*.jpg"))) == 8
    assert len(list((root / "labels/val").glob("*.txt"))) == 4
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["params"]["imgsz"] == 96 and len(manifest["files"]) == 2 * 12 + 1
    for p in (root / "images").rglob("*.jpg"):
        with Image.open(p) as im:
            assert im.format == "JPEG" and max(im.size) == 96 and min(im.size) >= 0.6 * 96 - 1
    assert not [p for p in tmp_path.iterdir() if p.name != "s"]  # no temporary folder left


def test_deterministic_byte_identical_and_seed_matters(tmp_path):
    a = tree(make_shapes_dataset(tmp_path / "a", **SMALL).parent)
    b = tree(make_shapes_dataset(tmp_path / "b", **SMALL).parent)
    c = tree(make_shapes_dataset(tmp_path / "c", seed=1, **SMALL).parent)
    assert a == b
    assert a["images/train/train_000000.jpg"] != c["images/train/train_000000.jpg"]


def test_idempotent_reuse_without_regenerating(tmp_path, monkeypatch):
    y = make_shapes_dataset(tmp_path / "s", **SMALL)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "s").rglob("*")}
    monkeypatch.setattr(synthetic, "_generate", lambda *a: pytest.fail("regenerated"))
    assert make_shapes_dataset(tmp_path / "s", **SMALL) == y
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "s").rglob("*")} == before
    # a different parameter set at the same root is refused, not silently mixed in
    with pytest.raises(FileExistsError, match="not a complete shapes dataset"):
        make_shapes_dataset(tmp_path / "s", n_train=9, n_val=4, imgsz=96)


def test_default_root_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path / "cache"))
    y = make_shapes_dataset(**SMALL)
    assert y == tmp_path / "cache" / "shapes-v1-8-4-96-0" / "data.yaml"


def test_atomic_on_failure(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = synthetic.render_shapes

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("disk on fire")
        return real(*a, **k)

    monkeypatch.setattr(synthetic, "render_shapes", flaky)
    with pytest.raises(RuntimeError):
        make_shapes_dataset(tmp_path / "s", **SMALL)
    assert list(tmp_path.iterdir()) == []  # neither the root nor a temporary folder
    (tmp_path / "s").mkdir()  # an empty folder at the root is fine to fill
    monkeypatch.setattr(synthetic, "render_shapes", real)
    assert make_shapes_dataset(tmp_path / "s", **SMALL).is_file()


def test_foreign_non_empty_root_is_refused(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        make_shapes_dataset(tmp_path / "s", **SMALL)
    assert (tmp_path / "s" / "mine.txt").read_text() == "keep me"


def test_labels_are_valid_and_resolve(tmp_path):
    cfg = resolve_data(make_shapes_dataset(tmp_path / "s", n_train=24, n_val=4, imgsz=128))
    assert cfg.nc == 5 and len(cfg.train) == 24 and len(cfg.val) == 4
    counts = [len(s.labels) for s in cfg.train + cfg.val]
    assert min(counts) >= 1 and max(counts) <= 6
    classes = np.concatenate([s.labels[:, 0] for s in cfg.train])
    assert set(classes.astype(int).tolist()) == set(range(5))
    for s in cfg.train:
        wh = (s.labels[:, 3:5] - s.labels[:, 1:3]) * [s.width, s.height]
        assert (wh > 1).all() and (wh <= 0.45 * min(s.width, s.height) + 2).all()


def test_boxes_tightly_enclose_the_drawn_shapes():
    for seed in range(12):
        rng = np.random.default_rng(seed)
        w, h = (160, 120) if seed % 2 else (120, 160)
        img, shapes = render_shapes(rng, w, h, plain=True)
        assert img.shape == (h, w, 3) and img.dtype == np.uint8 and 1 <= len(shapes) <= 6
        inside = np.zeros((h, w), bool)
        for s in shapes:
            x1, y1, x2, y2 = s.box
            assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
            inside[y1:y2, x1:x2] = True
            own = (img[y1:y2, x1:x2] == s.color).all(-1)
            # tight: the shape's colour touches all four sides of its box
            assert own[0].any() and own[-1].any() and own[:, 0].any() and own[:, -1].any()
        background = img[~inside]
        assert background.size and (background == background[0]).all()  # nothing drawn outside
        assert not (img[inside] == background[0]).all()


def test_resolve_shapes_uses_the_builtin_generator(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path))
    monkeypatch.setattr(synthetic, "make_shapes_dataset",
                        functools.partial(make_shapes_dataset, n_train=4, n_val=2, imgsz=64))
    cfg = resolve_data("shapes")
    assert cfg.source == "shapes" and cfg.names == dict(enumerate(SHAPE_NAMES))
    assert cfg.root == tmp_path / "shapes-v1-4-2-64-0" and len(cfg.train) == 4


def test_default_style_keeps_its_folder_and_manifest(tmp_path, monkeypatch):
    """Naming the default style changes nothing: same folder, same bytes, no style in the manifest."""
    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path))
    a = make_shapes_dataset(**SMALL)
    assert make_shapes_dataset(style=synthetic.ShapesStyle(), **SMALL) == a
    assert make_shapes_dataset(style="default", **SMALL) == a
    assert "style" not in json.loads((a.parent / "manifest.json").read_text())["params"]


def test_easy_style_is_cached_apart_and_follows_its_style(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path))
    easy = synthetic.SHAPES_STYLES["easy"]
    y = make_shapes_dataset(n_train=24, n_val=8, imgsz=128, style="easy")
    assert y.parent.name == "shapes-v1-easy-24-8-128-0"
    params = json.loads((y.parent / "manifest.json").read_text())["params"]
    assert params["style"]["objects"] == list(easy.objects) and params["style"]["max_hidden"] == 0.0
    default = tree(make_shapes_dataset(n_train=24, n_val=8, imgsz=128).parent)
    assert tree(y.parent)["images/val/val_000000.jpg"] != default["images/val/val_000000.jpg"]
    files = json.loads((y.parent / "manifest.json").read_text())["files"]
    train_hashes = {h for k, h in files.items() if k.startswith("images/train/")}
    assert not train_hashes & {h for k, h in files.items() if k.startswith("images/val/")}  # held out
    cfg = resolve_data(y)
    # a real detection problem: several objects of several classes per image, sizes and colours varying
    assert sum(len(set(s.labels[:, 0].tolist())) >= 2 for s in cfg.train) >= 0.9 * len(cfg.train)
    assert len({int(c) for s in cfg.train for c in s.labels[:, 0]}) == len(SHAPE_NAMES)
    lo, hi = easy.extent
    for s in cfg.train + cfg.val:
        assert easy.objects[0] <= len(s.labels) <= easy.objects[1]
        wh = (s.labels[:, 3:5] - s.labels[:, 1:3]) * [s.width, s.height]
        # a shape is never hidden, so its box spans at least the smallest shape's narrow side
        # (a tilted cross or triangle is narrower than its extent) and at most the largest extent
        assert (wh.max(1) >= 0.5 * lo * min(s.width, s.height)).all()
        assert (wh <= hi * min(s.width, s.height) + 2).all()
    # a custom style gets its own folder too, named by a hash of its fields
    custom = synthetic.ShapesStyle(objects=(2, 2), backgrounds=("flat",))
    yc = make_shapes_dataset(n_train=4, n_val=2, imgsz=64, style=custom)
    assert yc.parent.name.startswith("shapes-v1-custom") and yc.parent != y.parent
    assert all(len(s.labels) == 2 for s in resolve_data(yc).train)


def test_shapes_never_overlap_when_max_hidden_is_zero(monkeypatch):
    """With max_hidden=0 every shape keeps all its pixels: the masks drawn are disjoint and each
    label is the box of its whole mask."""
    drawn = []
    real = synthetic.shape_mask

    def recording(*a, **k):
        m = real(*a, **k)
        drawn.append(m)
        return m

    monkeypatch.setattr(synthetic, "shape_mask", recording)
    style = synthetic.ShapesStyle(objects=(6, 6), extent=(0.2, 0.4), max_hidden=0.0)
    for seed in range(8):
        drawn.clear()
        _, shapes = render_shapes(np.random.default_rng(seed), 160, 128, style=style)
        boxes = {}
        for m in drawn:
            ys, xs = np.nonzero(m)
            if xs.size:
                boxes.setdefault((int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1), m)
        kept = [boxes[s.box] for s in shapes]  # KeyError: a label is not a whole drawn shape
        assert (np.sum(kept, axis=0) <= 1).all()


def test_style_values_are_checked():
    for bad, match in ((dict(objects=(0, 3)), "objects"), (dict(objects=(4, 2)), "objects"),
                       (dict(extent=(0.5, 0.2)), "extent"), (dict(max_hidden=1.0), "max_hidden"),
                       (dict(backgrounds=("plaid",)), "backgrounds"), (dict(backgrounds=()), "backgrounds"),
                       (dict(grain=2.0), "grain")):
        with pytest.raises(ValueError, match=match):
            synthetic.ShapesStyle(**bad)
    with pytest.raises(ValueError, match="unknown shapes style 'hard'"):
        make_shapes_dataset(style="hard", **SMALL)
