"""Boxes and Results: box formats, indexing, conversions, summary/JSON, plotting and saving."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo.results import PALETTE, Boxes, Results, class_color

NAMES = {0: "person", 1: "car", 2: "dog"}
H, W = 200, 400


def make_boxes() -> Boxes:
    data = torch.tensor(
        [
            [10.0, 20.0, 110.0, 70.0, 0.9, 0.0],  # centre (60, 45), 100 x 50
            [200.0, 100.0, 300.0, 180.0, 0.5, 2.0],  # centre (250, 140), 100 x 80
            [0.0, 0.0, 40.0, 30.0, 0.25, 1.0],  # touches the top-left corner
        ]
    )
    return Boxes(data, (H, W))


def make_image() -> np.ndarray:
    img = np.zeros((H, W, 3), np.uint8)
    img[:] = (90, 120, 150)
    return img


def make_results(boxes: Boxes | None = None, path: str = "/some/dir/street.png") -> Results:
    return Results(make_image(), path, NAMES, make_boxes() if boxes is None else boxes,
                   speed={"preprocess": 1.0, "inference": 2.0, "postprocess": 0.5})


def empty_boxes() -> Boxes:
    return Boxes(torch.zeros((0, 6)), (H, W))


# ---- Boxes ----------------------------------------------------------------------------------------


def test_box_formats_hand_computed():
    b = make_boxes()
    assert b.shape == (3, 6) and len(b) == 3 and b.orig_shape == (H, W)
    assert torch.equal(b.xyxy[0], torch.tensor([10.0, 20.0, 110.0, 70.0]))
    assert torch.equal(b.xywh[:2], torch.tensor([[60.0, 45.0, 100.0, 50.0], [250.0, 140.0, 100.0, 80.0]]))
    assert torch.allclose(b.xyxyn[0], torch.tensor([10 / W, 20 / H, 110 / W, 70 / H]))
    assert torch.allclose(b.xywhn[1], torch.tensor([250 / W, 140 / H, 100 / W, 80 / H]))
    assert torch.equal(b.conf, torch.tensor([0.9, 0.5, 0.25]))
    assert torch.equal(b.cls, torch.tensor([0.0, 2.0, 1.0]))
    assert b.data.data_ptr() == b.xyxy.data_ptr()  # xyxy is a view, xywh a new tensor
    assert b.xywh.data_ptr() != b.data.data_ptr()


def test_box_formats_numpy_match_torch():
    b = make_boxes()
    n = b.numpy()
    assert isinstance(n.data, np.ndarray) and n.orig_shape == b.orig_shape
    for prop in ("data", "xyxy", "xywh", "xyxyn", "xywhn", "conf", "cls"):
        value = getattr(n, prop)
        assert isinstance(value, np.ndarray), prop
        np.testing.assert_allclose(value, getattr(b, prop).numpy(), rtol=1e-6, err_msg=prop)
    assert n.numpy().data is n.data  # already numpy
    assert n[0].data.shape == (1, 6)
    back = n.to("cpu")
    assert isinstance(back.data, torch.Tensor) and torch.equal(back.data, b.data)


def test_boxes_indexing():
    b = make_boxes()
    first = b[0]
    assert isinstance(first, Boxes) and first.shape == (1, 6) and first.orig_shape == (H, W)
    assert torch.equal(b[-1].data, b.data[2:3])
    assert torch.equal(b[1:].data, b.data[1:])
    mask = b.conf > 0.3
    assert torch.equal(b[mask].cls, torch.tensor([0.0, 2.0]))
    assert torch.equal(b[mask.numpy()].cls, torch.tensor([0.0, 2.0]))  # numpy mask on tensor data
    assert np.array_equal(b.numpy()[mask].cls, np.array([0.0, 2.0], np.float32))  # and vice versa
    assert len(b[b.conf > 2]) == 0


def test_boxes_cpu_to_and_repr():
    b = make_boxes()
    assert torch.equal(b.cpu().data, b.data)
    d = b.to(torch.float64)
    assert d.data.dtype == torch.float64 and d.orig_shape == b.orig_shape
    text = repr(b)
    assert "n=3" in text and "(200, 400)" in text


def test_boxes_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"\(3, 5\)"):
        Boxes(torch.zeros(3, 5), (H, W))
    with pytest.raises(TypeError):
        Boxes([[0, 0, 1, 1, 1, 0]], (H, W))  # type: ignore[arg-type]


def test_empty_boxes_everywhere():
    b = empty_boxes()
    assert len(b) == 0 and b.shape == (0, 6)
    for prop in ("xyxy", "xywh", "xyxyn", "xywhn"):
        assert tuple(getattr(b, prop).shape) == (0, 4)
        assert getattr(b.numpy(), prop).shape == (0, 4)
    assert tuple(b.conf.shape) == (0,) and tuple(b.cls.shape) == (0,)
    assert len(b[b.conf > 0.5]) == 0 and len(b.cpu()) == 0
    repr(b)


# ---- Results --------------------------------------------------------------------------------------


def test_results_basics():
    r = make_results()
    assert len(r) == 3 and r.orig_shape == (H, W) and r.path == "/some/dir/street.png"
    assert r.speed == {"preprocess": 1.0, "inference": 2.0, "postprocess": 0.5}
    assert "boxes=3" in repr(r)
    c = r.cpu()
    assert isinstance(c, Results) and torch.equal(c.boxes.data, r.boxes.data)
    assert isinstance(r.numpy().boxes.data, np.ndarray)
    default_speed = Results(make_image(), "x.png", NAMES, None).speed
    assert set(default_speed) == {"preprocess", "inference", "postprocess"}


def test_results_accepts_tensor_image_and_checks_shape():
    img = torch.from_numpy(make_image())
    r = Results(img, "image0", NAMES, make_boxes())
    assert isinstance(r.orig_img, np.ndarray) and r.orig_img.shape == (H, W, 3)
    with pytest.raises(ValueError, match=r"\(3, 200, 400\)"):
        Results(img.permute(2, 0, 1), "image0", NAMES, None)


def test_summary_and_json_roundtrip():
    r = make_results()
    summary = r.summary()
    assert summary[0] == {
        "name": "person",
        "class": 0,
        "confidence": 0.9,
        "box": {"x1": 10.0, "y1": 20.0, "x2": 110.0, "y2": 70.0},
    }
    assert summary[1]["name"] == "dog" and summary[1]["class"] == 2
    for row in summary:
        assert type(row["class"]) is int and type(row["confidence"]) is float
        assert all(type(v) is float for v in row["box"].values())
    assert json.loads(r.to_json()) == summary
    norm = r.summary(normalize=True)
    assert norm[0]["box"] == {"x1": 0.025, "y1": 0.1, "x2": 0.275, "y2": 0.35}


def test_summary_rounds_and_unknown_class():
    boxes = Boxes(torch.tensor([[1.123456789, 2.0, 3.0, 4.0, 0.123456789, 7.0]], dtype=torch.float64), (H, W))
    (row,) = Results(make_image(), "a.png", NAMES, boxes).summary()
    assert row["box"]["x1"] == 1.12346 and row["confidence"] == 0.12346
    assert row["name"] == "7"


def test_empty_results_everywhere(tmp_path):
    for boxes in (empty_boxes(), None):
        r = Results(make_image(), "image0", NAMES, boxes)
        assert len(r) == 0 and r.summary() == [] and json.loads(r.to_json()) == []
        out = r.plot()
        assert np.array_equal(out, r.orig_img) and out is not r.orig_img
        path = r.save(tmp_path / f"empty_{boxes is None}.png")
        assert np.array_equal(np.asarray(Image.open(path)), r.orig_img)
        r.cpu()


def test_plot_draws_boxes_without_touching_original():
    r = make_results()
    before = r.orig_img.copy()
    out = r.plot()
    assert out.shape == r.orig_img.shape and out.dtype == np.uint8
    assert not np.shares_memory(out, r.orig_img)
    assert np.array_equal(r.orig_img, before)
    # The outline of box 1 (class 2) is in its palette colour; far from every box nothing changed.
    assert tuple(out[140, 200]) == class_color(2) == PALETTE[2]
    assert tuple(out[140, 300]) == class_color(2)
    assert np.array_equal(out[150:200, 320:400], before[150:200, 320:400])
    assert np.array_equal(out[120:200, 0:150], before[120:200, 0:150])
    # The interior of a box is not filled.
    assert np.array_equal(out[150:170, 230:270], before[150:170, 230:270])


@pytest.mark.parametrize("top, above", [(60.0, True), (0.0, False)])
def test_label_tag_above_box_or_inside_at_top_edge(top, above):
    box = Boxes(torch.tensor([[100.0, top, 300.0, top + 100.0, 0.87, 1.0]]), (H, W))
    r = Results(make_image(), "x.png", NAMES, box)
    out = r.plot(line_width=2, font_size=12)
    color = np.array(class_color(1))
    band_above = out[int(top) - 12:int(top) - 2, 104:140] if above else None
    band_inside = out[int(top) + 4:int(top) + 12, 104:140]
    inside_fill = (band_inside == color).all(axis=2).mean()
    if above:
        assert (band_above == color).all(axis=2).mean() > 0.5  # the filled tag above the box
        assert inside_fill == 0  # and the box interior is untouched
    else:
        assert inside_fill > 0.5  # no room above: the tag is drawn inside the box


def test_plot_options_change_output():
    r = make_results()
    default = r.plot()
    thick = r.plot(line_width=6)
    no_labels = r.plot(labels=False)
    assert not np.array_equal(default, thick)
    assert not np.array_equal(default, no_labels)
    assert np.array_equal(no_labels[80:100, 200:300], r.orig_img[80:100, 200:300])  # no tag above box 1
    assert not np.array_equal(default[80:100, 200:300], r.orig_img[80:100, 200:300])
    assert not np.array_equal(r.plot(conf=False), default)
    assert r.plot(font_size=30).shape == default.shape


def test_plot_survives_odd_boxes():
    data = torch.tensor(
        [
            [-50.0, -20.0, 1000.0, 900.0, 0.7, 1.0],  # larger than the image
            [300.0, 150.0, 100.0, 50.0, 0.6, 0.0],  # corners swapped
            [float("nan"), 0.0, 10.0, 10.0, 0.5, 0.0],  # not finite: skipped
            [390.0, 190.0, 399.0, 199.0, 0.4, 45.0],  # class beyond the palette, near the corner
        ]
    )
    r = Results(make_image(), "x.png", NAMES, Boxes(data, (H, W)))
    assert r.plot().shape == (H, W, 3)
    assert class_color(45) == PALETTE[45 % len(PALETTE)]


def test_save_writes_atomically(tmp_path):
    r = make_results()
    target = tmp_path / "nested" / "dir" / "out.png"
    written = r.save(target)
    assert written == str(target)
    assert np.array_equal(np.asarray(Image.open(written)), r.plot())  # PNG: lossless
    assert sorted(os.listdir(target.parent)) == ["out.png"]  # no temporary file left behind
    jpg = r.save(str(tmp_path / "out.jpg"))
    with Image.open(jpg) as im:
        assert im.format == "JPEG" and im.size == (W, H)
    r.save(target)  # overwriting works
    assert sorted(os.listdir(target.parent)) == ["out.png"]


def test_save_default_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert make_results(path="/data/imgs/street.png").save() == "street_pred.jpg"
    assert make_results(path="image0").save() == "image0_pred.jpg"
    assert sorted(os.listdir(tmp_path)) == ["image0_pred.jpg", "street_pred.jpg"]


def test_save_unknown_suffix_and_failure_cleanup(tmp_path, monkeypatch):
    r = make_results()
    with pytest.raises(ValueError, match=r"\.xyz"):
        r.save(tmp_path / "out.xyz")
    target = tmp_path / "out.png"
    r.save(target)
    good = target.read_bytes()

    def failing_save(self, fp, *args, **kwargs):
        fp.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        r.save(target)
    assert target.read_bytes() == good  # the old file is intact, not half-overwritten
    assert os.listdir(tmp_path) == ["out.png"]  # and the temporary file is gone


# ---- show -----------------------------------------------------------------------------------------


@pytest.fixture
def show_env(monkeypatch):
    """A Linux process that has not warned yet; PIL's viewer call recorded, answering ``True``."""
    import libreyolo.results as R

    monkeypatch.setattr(R, "_warned_cannot_show", False)
    monkeypatch.setattr(R.sys, "platform", "linux")
    monkeypatch.setattr(R.os, "name", "posix")
    calls: list[tuple[tuple[int, int], str | None]] = []
    answer = {"viewer_found": True}

    def fake_show(image, title=None, **options):
        calls.append((image.size, title))
        return answer["viewer_found"]

    monkeypatch.setattr(R.ImageShow, "show", fake_show)
    return calls, answer


def _show_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Results.show()" in r.getMessage()]


def test_show_headless_warns_once_and_points_to_save(show_env, monkeypatch, caplog):
    calls, _ = show_env
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with caplog.at_level("WARNING", logger="libreyolo"):
        assert make_results().show() is False
        assert make_results().show() is False
    assert calls == []  # no viewer is started that could not show anything
    warnings = _show_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "no display was found" in warnings[0] and "save(" in warnings[0]


@pytest.mark.parametrize("var", ["DISPLAY", "WAYLAND_DISPLAY"])
def test_show_with_a_display_opens_the_viewer(show_env, monkeypatch, caplog, var):
    calls, _ = show_env
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv(var, ":0" if var == "DISPLAY" else "wayland-0")
    with caplog.at_level("WARNING", logger="libreyolo"):
        assert make_results().show() is True
    assert calls == [((W, H), "street.png")]
    assert _show_warnings(caplog) == []


def test_show_without_a_viewer_warns_once(show_env, monkeypatch, caplog):
    calls, answer = show_env
    monkeypatch.setenv("DISPLAY", ":0")
    answer["viewer_found"] = False
    with caplog.at_level("WARNING", logger="libreyolo"):
        assert make_results().show() is False
        assert make_results().show() is False
    assert len(calls) == 2
    warnings = _show_warnings(caplog)
    assert len(warnings) == 1 and "no image viewer was found" in warnings[0]


def test_show_on_macos_needs_no_display_variable(show_env, monkeypatch):
    import libreyolo.results as R

    calls, _ = show_env
    monkeypatch.setattr(R.sys, "platform", "darwin")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert make_results().show() is True and len(calls) == 1
