"""The predictor's repeat of a call's signature (engine/predictor.py: Signature, Predictor._repeat).

A call whose keywords and kind of source (type, shape, dtype, layout) equal the previous call's,
on the same model, reuses that call's checked options, plan and stage; every other call takes the
full path. Each test checks both halves: the repeat is taken where it should be
(``Predictor.repeats``), never where anything differs, and the Results equal those of the full
path (``Predictor.reuse = False``) bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from standin import StandInCapturer

from libreyolo import LibreYOLO
from libreyolo.engine.predictor import _call_key


@pytest.fixture
def cls_model():
    m = LibreYOLO.new("resnet", "18", nc=10, imgsz=32, device="cpu", seed=0)
    m._warned_untrained = True
    return m


def image(seed: int, shape=(32, 40, 3), dtype=np.uint8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.random(shape).astype(dtype)


def full(m, source, **kw):
    """The Results of the full path (every step built again), the reference."""
    p = m.get_predictor()
    saved, last, repeats = p.reuse, p._last, p.repeats
    p.reuse = False
    try:
        return m(source, **kw)
    finally:
        p.reuse, p._last = saved, last
        assert p.repeats == repeats


def same_probs(a, b) -> None:
    assert torch.equal(a.probs.data, b.probs.data)
    assert a.probs.top == b.probs.top and torch.equal(a.probs.topconf, b.probs.topconf)
    assert np.array_equal(a.orig_img, b.orig_img) and a.path == b.path and a.names == b.names
    assert set(a.speed) == set(b.speed)
    assert (a.frame_index, a.timestamp, a.stream) == (b.frame_index, b.timestamp, b.stream)


def test_a_repeat_reuses_the_signature_and_reads_the_new_image(cls_model):
    m = cls_model
    p = m.get_predictor()
    first = m(image(0), topk=3)
    assert p.repeats == 0 and p._last is not None
    plan = p._last.plan
    for seed in (1, 2, 3):
        r = m(image(seed), topk=3)
        same_probs(r, full(m, image(seed), topk=3))
    assert p.repeats == 3 and p._last.plan is plan   # the same plan object, not rebuilt
    assert not torch.equal(first.probs.data, r.probs.data)   # each call's own image
    assert set(r.speed) == {"load", "preprocess", "inference", "postprocess"}


@pytest.mark.parametrize("change", [
    {"topk": 2},            # another value
    {"topk": True},         # an equal value of another type (True == 1) is another signature
    {"bgr": False},         # another channel order
    {"imgsz": 64},          # another size
    {"cuda_graph": "auto"},
    {},                     # an option left out
])
def test_another_option_takes_the_full_path(cls_model, change):
    m = cls_model
    p = m.get_predictor()
    kw = {"topk": 1, "bgr": True, "imgsz": 32, "cuda_graph": False}
    m(image(0), **kw)
    m(image(1), **kw)
    assert p.repeats == 1
    other = {**kw, **change} if change else {k: v for k, v in kw.items() if k != "topk"}
    try:
        want = full(m, image(2), **other)
    except Exception as exc:   # the full path's error, raised again by the call itself
        with pytest.raises(type(exc), match=str(exc)[:40]):
            m(image(2), **other)
    else:
        same_probs(m(image(2), **other), want)
    assert p.repeats == 1


@pytest.mark.parametrize("source", [
    image(5, (48, 40, 3)),                               # another size
    image(5, (32, 40, 3), np.float32),                   # another dtype (float in [0, 1])
    image(5, (32, 40)),                                   # grey
    image(5, (32, 40, 4)),                               # BGRA
    np.asfortranarray(image(5)),                         # another memory layout
    torch.from_numpy(image(5)).permute(2, 0, 1).contiguous(),   # a tensor
    [image(5)],                                          # a list: never a repeat
])
def test_another_kind_of_source_takes_the_full_path(cls_model, source):
    m = cls_model
    p = m.get_predictor()
    m(image(0))
    m(image(1))
    assert p.repeats == 1
    r = m(source)
    r = r[0] if isinstance(r, list) else r
    want = full(m, source)
    same_probs(r, want[0] if isinstance(want, list) else want)
    assert p.repeats == 1
    # and that kind repeats in turn (a list never does)
    r2 = m(source)
    assert p.repeats == (1 if isinstance(source, list) else 2)
    same_probs(r2[0] if isinstance(r2, list) else r2, want[0] if isinstance(want, list) else want)


def test_a_repeat_checks_its_own_source(cls_model):
    m = cls_model
    p = m.get_predictor()
    good = image(0, dtype=np.float32)
    m(good)
    bad = good * 255   # the same kind (float32, same shape), values outside [0, 1]: each call's own check
    with pytest.raises(ValueError, match=r"float images must be finite and lie in \[0, 1\]"):
        m(bad)
    assert p.repeats == 1   # the repeat was taken, and its source check ran
    same_probs(m(good), full(m, good))


@pytest.mark.parametrize("what", ["reload", "device", "reset_classes", "preprocess", "imgsz", "release", "attach"])
def test_a_changed_model_takes_the_full_path_or_reads_the_change(cls_model, what):
    m = cls_model
    m.runner.capturer = StandInCapturer()
    kw = {"cuda_graph": True}
    m(image(0), **kw)
    m(image(1), **kw)
    p = m.get_predictor()
    assert p.repeats == 1
    before = m(image(2), **kw)
    repeats = p.repeats
    if what == "reload":   # new weights in place: the signature still serves, the runner's check sees them
        sd = {k: v + 0.01 if v.is_floating_point() else v for k, v in m.model.state_dict().items()}
        m.load_state_dict(sd)
    elif what == "device":
        m.to("cpu:0")
    elif what == "reset_classes":
        m.reset_classes(4)
        m.model.eval()   # reset_classes leaves the new network in training mode
    elif what == "preprocess":
        import dataclasses
        m.preprocess = dataclasses.replace(m.preprocess)
    elif what == "imgsz":
        m.imgsz = 64
    elif what == "release":
        m.release_graphs()
    elif what == "attach":
        m._attach(m.model)
    m.runner.capturer = StandInCapturer()
    p = m.get_predictor()
    after = m(image(2), **kw)
    want = full(m, image(2), **kw)
    same_probs(after, want)
    reused = p.repeats > (repeats if p is m._predictor and what not in ("reset_classes", "attach") else 0)
    assert reused == (what in ("reload", "release"))
    if what == "reload":
        assert not torch.equal(after.probs.data, before.probs.data)   # the new weights, not a stale graph
    if what == "reset_classes":
        assert after.probs.data.shape == (4,)


def test_cuda_graph_on_and_off_alternate_through_the_full_path(cls_model):
    m = cls_model
    m.runner.capturer = StandInCapturer()
    p = m.get_predictor()
    for graph in (True, True, False, False, True):
        r = m(image(0), cuda_graph=graph)
        same_probs(r, full(m, image(0), cuda_graph=graph))
    assert p.repeats == 2   # the second True and the second False
    assert m.runner.eager_calls > 0 and m.graph_info()["replays"] > 0


def test_calls_that_never_repeat(cls_model, tmp_path):
    m = cls_model
    p = m.get_predictor()
    for kw in ({"save": True, "save_dir": str(tmp_path)}, {"verbose": True}, {"profile": True}):
        m(image(0), **kw)
        m(image(0), **kw)
        assert p.repeats == 0 and p._last is None
    seen = []
    m(image(0), on_results=lambda r, it: seen.append(r))
    m(image(0), on_results=lambda r, it: seen.append(r))
    assert len(seen) == 2 and p.repeats == 0
    assert list(m(image(0), stream=True)) and p._last is None
    p.reuse = False   # the A/B switch
    m(image(0))
    m(image(0))
    assert p.repeats == 0


def test_call_key_reads_only_immutable_scalars_and_one_array_or_tensor():
    arr = image(0)
    assert _call_key({"topk": 3}, arr) == _call_key({"topk": 3}, image(1))
    assert _call_key({"topk": 3}, arr) != _call_key({"topk": 3.0}, arr)
    assert _call_key({"a": 1, "b": 2}, arr) != _call_key({"b": 2, "a": 1}, arr)   # order: another key
    assert _call_key({"classes": [0]}, arr) is None and _call_key({}, "img.jpg") is None
    assert _call_key({}, [arr]) is None and _call_key({}, arr.view(np.ndarray)[None][0]) is not None
    t = torch.zeros(3, 8, 8, dtype=torch.uint8)
    assert _call_key({}, t) != _call_key({}, t.float()) and _call_key({}, t) != _call_key({}, t.transpose(1, 2))


def test_detection_repeats_and_reads_its_options():
    m = LibreYOLO.new("yolox", "n", imgsz=64, device="cpu", seed=0)
    m._warned_untrained = True
    p = m.get_predictor()
    img = image(0, (48, 64, 3))
    kw = {"conf": 0.001, "max_det": 20}
    m(img, **kw)
    r = m(img, **kw)
    assert p.repeats == 1
    want = full(m, img, **kw)
    assert torch.equal(r.boxes.data, want.boxes.data) and len(r.boxes) > 0
    r = m(img, conf=0.5, max_det=20)   # another threshold: the full path
    assert p.repeats == 1 and torch.equal(r.boxes.data, full(m, img, conf=0.5, max_det=20).boxes.data)
    m(img, classes="person")
    m(img, classes="person")   # class names: read from the model's names each call, never reused
    assert p.repeats == 1
    m(img, **kw)
    m.fuse()
    r = m(img, **kw)
    assert p.repeats == 1   # fused: the full path
    assert torch.allclose(r.boxes.data, want.boxes.data, atol=1e-3)


@pytest.mark.parametrize("spec", [("rtmdet", "t", "segment"), ("yolonas", "n", "pose"), ("yolonas", "s", "obb")])
def test_segment_pose_and_obb_repeat_with_the_full_paths_results(spec):
    family, size, task = spec
    m = LibreYOLO.new(family, size, task=task, imgsz=64, device="cpu", seed=0)
    m._warned_untrained = True
    p = m.get_predictor()
    img = image(0, (48, 64, 3))
    kw = {"conf": 0.001, "max_det": 20}
    m(img, **kw)
    r = m(image(1, (48, 64, 3)), **kw)
    assert p.repeats == 1
    want = full(m, image(1, (48, 64, 3)), **kw)
    if task == "obb":
        assert torch.equal(r.obb.data, want.obb.data) and len(r.obb) > 0
    else:
        assert torch.equal(r.boxes.data, want.boxes.data) and len(r.boxes) > 0
    if task == "segment":
        assert torch.equal(r.masks.data, want.masks.data)
    elif task == "pose":
        assert torch.equal(r.keypoints.data, want.keypoints.data)
    m(img, conf=0.5, max_det=20)   # another threshold: the full path
    assert p.repeats == 1
    m(img, classes=m.names[0])
    m(img, classes=m.names[0])     # class names: read from the model's names each call, never reused
    assert p.repeats == 1
