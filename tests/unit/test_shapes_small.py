"""The small-object style of the shapes set (sliced inference and test-time augmentation)."""
from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

import libreyolo.data.synthetic as synthetic
from libreyolo.data.datasets import resolve_data
from libreyolo.data.synthetic import SHAPES_STYLES, make_shapes_dataset, render_shapes


def sides(canvas: int, seeds: range) -> np.ndarray:
    out = []
    for seed in seeds:
        _, shapes = render_shapes(np.random.default_rng(seed), canvas, canvas, style=SHAPES_STYLES["small"])
        out += [max(s.box[2] - s.box[0], s.box[3] - s.box[1]) for s in shapes]
    return np.asarray(out)


def test_small_objects_keep_their_pixel_size_on_any_canvas():
    lo, hi = SHAPES_STYLES["small"].extent_px
    small, large = sides(160, range(6)), sides(640, range(6))
    for s in (small, large):
        assert len(s) >= 6 * 4 and s.min() >= lo * 0.5 and s.max() <= hi + 2
    # the same size distribution: pixels, not a fraction of the canvas (4x the side here)
    assert abs(np.median(small) - np.median(large)) <= 4


def test_small_set_is_cached_apart_with_its_style(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path))
    y = make_shapes_dataset(n_train=4, n_val=2, imgsz=256, style="small")
    assert y.parent.name == "shapes-v1-small-4-2-256-0"
    params = json.loads((y.parent / "manifest.json").read_text())["params"]
    assert params["style"]["extent_px"] == [6.0, 32.0]
    cfg = resolve_data(y)
    for s in cfg.train + cfg.val:
        wh = (s.labels[:, 3:5] - s.labels[:, 1:3]) * [s.width, s.height]
        assert 4 <= len(s.labels) <= 12 and (wh <= 34).all()


def test_styles_without_pixel_sizes_keep_their_manifest_fields():
    """extent_px is recorded only when set: the sets made before it keep their manifests (and a
    custom style its folder name)."""
    easy = SHAPES_STYLES["easy"]
    fields = easy.fields()
    assert "extent_px" not in fields and fields == {k: v for k, v in asdict(easy).items() if k != "extent_px"}
    assert SHAPES_STYLES["small"].fields()["extent_px"] == (6.0, 32.0)
    with pytest.raises(ValueError, match="extent_px"):
        synthetic.ShapesStyle(extent_px=(2.0, 10.0))
    with pytest.raises(ValueError, match="extent_px"):
        synthetic.ShapesStyle(extent_px=(20.0, 10.0))
