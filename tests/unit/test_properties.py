"""Property-based tests: random inputs either work or raise one of the library's documented errors.

For sources (numpy arrays of random dtypes and shapes, tensors, every PIL mode, random file
bytes), datasets (label rows, YAML specs, COCO json fragments written to temp folders) and
every option validator: the call returns a well-formed result, or raises ValueError / TypeError
/ FileNotFoundError with a message of ours (naming the input), never an exception from deep
inside numpy, torch or PIL (IndexError, KeyError, AttributeError, ZeroDivisionError,
OverflowError, ...), and never hangs (each example has a deadline).

Examples are derandomized (the same ones on every run, so CI is stable); set
LIBREYOLO_HYPOTHESIS_EXPLORE=1 to draw new ones.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

hypothesis = pytest.importorskip("hypothesis", reason="property tests need hypothesis (the 'test' extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from libreyolo import options  # noqa: E402
from libreyolo.data.datasets import resolve_data  # noqa: E402
from libreyolo.data.sources import load_sources, pil_to_rgb  # noqa: E402
from libreyolo.options import OptionError  # noqa: E402

SETTINGS = dict(
    deadline=timedelta(seconds=5),
    database=None,
    derandomize=not os.environ.get("LIBREYOLO_HYPOTHESIS_EXPLORE"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
fast = settings(max_examples=100, **SETTINGS)
io_bound = settings(max_examples=40, **SETTINGS)


def check_items(items) -> None:
    for item in items:
        img = item.image
        assert img.ndim == 3 and img.shape[2] == 3 and min(img.shape[:2]) >= 1
        if isinstance(img, np.ndarray):
            assert img.dtype == np.uint8 and img.flags.c_contiguous
        else:
            assert img.dtype == torch.uint8 and img.is_contiguous()


# ---- sources ----------------------------------------------------------------------------------------

DTYPES = [np.uint8, np.uint16, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_,
          np.complex64]
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(shapes)
    if dtype.kind == "f":
        elements = st.one_of(st.floats(0, 1, width=dtype.itemsize * 8),
                             st.floats(allow_nan=True, allow_infinity=True, width=dtype.itemsize * 8))
        return draw(hnp.arrays(dtype, shape, elements=elements))
    return draw(hnp.arrays(dtype, shape))


@fast
@given(arr=arrays(), bgr=st.booleans(), transpose=st.booleans())
def test_any_numpy_array_loads_or_is_refused_by_name(arr, bgr, transpose):
    if transpose and arr.ndim >= 2:
        arr = arr.swapaxes(0, 1)  # non-contiguous
    try:
        items = load_sources(arr, bgr=bgr)
    except ValueError as e:
        assert "numpy array" in str(e), e
        if arr.dtype.kind == "f" and arr.ndim in (2, 3) and arr.size and (arr.ndim == 2 or arr.shape[2] in (1, 3, 4)):
            lo, hi = float(np.min(arr)), float(np.max(arr))
            assert not (math.isfinite(lo) and math.isfinite(hi) and lo >= -1e-3 and hi <= 1 + 1e-3), \
                "a valid float image was refused"
        return
    assert arr.dtype in (np.uint8,) or arr.dtype.kind == "f"
    check_items(items)
    assert items[0].image.shape[:2] == arr.shape[:2]


TORCH_DTYPES = [torch.uint8, torch.int16, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                torch.float64, torch.bool]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=5).map(tuple))
    kind = draw(st.sampled_from(["unit", "wide", "special"]))
    x = torch.rand(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16))))
    if kind == "wide":
        x = x * 300 - 20
    elif kind == "special" and x.numel():
        x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    if dtype == torch.bool:
        return x > 0.5
    if not dtype.is_floating_point:
        return x.nan_to_num(0, 0, 0).clamp(0, 255).to(dtype)
    return x.to(dtype)


@fast
@given(t=tensors())
def test_any_tensor_loads_or_is_refused_by_name(t):
    try:
        items = load_sources(t)
    except ValueError as e:
        assert "torch tensor" in str(e), e
        return
    assert t.dtype == torch.uint8 or t.dtype.is_floating_point
    if t.dtype.is_floating_point:
        lo, hi = float(t.min()), float(t.max())
        assert math.isfinite(lo) and math.isfinite(hi) and -1e-3 <= lo and hi <= 1 + 1e-3
    check_items(items)


@fast
@given(mode=st.sampled_from(Image.MODES), w=st.integers(1, 6), h=st.integers(1, 6), data=st.data())
def test_every_pil_mode_with_random_pixels_becomes_rgb(mode, w, h, data):
    n = len(Image.new(mode, (w, h)).tobytes())
    im = Image.frombytes(mode, (w, h), data.draw(st.binary(min_size=n, max_size=n)))
    if mode in ("P", "PA"):
        im.putpalette(data.draw(st.binary(min_size=768, max_size=768)))
    out = pil_to_rgb(im)
    assert out.shape == (h, w, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    (item,) = load_sources(im)
    np.testing.assert_array_equal(item.image, out)


@io_bound
@given(payload=st.binary(max_size=400), suffix=st.sampled_from([".png", ".jpg", ".bmp", ".tif", ".webp"]),
       cut=st.integers(0, 2000))
def test_random_or_truncated_file_bytes_decode_or_are_named(payload, suffix, cut):
    with tempfile.TemporaryDirectory() as d:
        real = Path(d) / f"real{suffix}"
        Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3)).save(real)
        junk = Path(d) / f"junk{suffix}"
        junk.write_bytes(payload)
        cut_file = Path(d) / f"cut{suffix}"
        cut_file.write_bytes(real.read_bytes()[:cut])
        for path in (junk, cut_file):
            try:
                check_items(load_sources(path))
            except ValueError as e:
                assert str(e).startswith(f"cannot decode image '{path}'"), e


# ---- datasets ---------------------------------------------------------------------------------------

tokens = st.one_of(
    st.integers(-3, 12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(-0.2, 1.2).map(lambda v: f"{v:.3f}"),
    st.sampled_from(["", "nan", "inf", "-0", "1e999", "0x1", "\ufeff0", "a", "1,5", "٣"]),
    st.text(max_size=4),
)
rows = st.lists(st.lists(tokens, min_size=0, max_size=7).map(" ".join), max_size=6).map("\n".join)


def tiny_yolo(root: Path, train_label: str | bytes, val_label: str, spec: str | None = None) -> Path:
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        Image.new("RGB", (8, 6), (50, 60, 70)).save(root / "images" / split / "a.png")
    train = root / "labels/train/a.txt"
    train.write_bytes(train_label if isinstance(train_label, bytes) else train_label.encode("utf-8", "surrogatepass"))
    (root / "labels/val/a.txt").write_text(val_label, encoding="utf-8", errors="surrogatepass")
    y = root / "data.yaml"
    y.write_text(spec if spec is not None else "path: .\ntrain: images/train\nval: images/val\nnc: 5\n")
    return y


def dataset_outcome(y: Path) -> None:
    """resolve_data(y) works (well-formed samples) or raises a documented error of ours."""
    try:
        cfg = resolve_data(y)
    except (ValueError, FileNotFoundError) as e:
        assert str(y) in str(e) or str(y.parent) in str(e), e
        return
    for s in cfg.train + cfg.val:
        assert s.labels.dtype == np.float32 and s.labels.ndim == 2 and s.labels.shape[1] == 5
        assert np.isfinite(s.labels).all() and (s.labels[:, 1:] >= 0).all() and (s.labels[:, 1:] <= 1).all()
        assert (s.labels[:, 0] >= 0).all() and (s.labels[:, 0] < cfg.nc).all()


@io_bound
@given(train=rows, val=rows, bom=st.booleans())
def test_random_label_rows(train, val, bom):
    with tempfile.TemporaryDirectory() as d:
        raw = train.encode("utf-8", "surrogatepass")
        dataset_outcome(tiny_yolo(Path(d), (b"\xef\xbb\xbf" if bom else b"") + raw, val))


scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 100), st.floats(allow_nan=True),
                    st.text(max_size=8), st.sampled_from([".", "images/train", "images/val", "missing", "data.yaml"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(scalars.filter(lambda k: k is not None and
                                                                                      not (isinstance(k, float) and math.isnan(k))),
                                                                       inner, max_size=3)),
                      max_leaves=8)
KEYS = ["path", "train", "val", "names", "nc", "format"]
specs = st.fixed_dictionaries({}, optional={k: values for k in KEYS}).map(
    lambda d: {**{"path": ".", "train": "images/train", "val": "images/val"}, **d})


@io_bound
@given(spec=st.one_of(specs, values))
def test_random_yaml_specs(spec):
    with tempfile.TemporaryDirectory() as d:
        y = tiny_yolo(Path(d), "0 0.5 0.5 0.2 0.2\n", "", spec=yaml.safe_dump(spec, allow_unicode=True))
        dataset_outcome(y)


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 120), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=6), st.sampled_from(["a.png", "b.png", "../a.png", "/a.png", ""]))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                           max_leaves=10)
def usually(valid, optional: dict | None = None):
    """A dict with every key of ``valid`` (each value valid or random) and maybe ``optional`` keys."""
    return st.fixed_dictionaries({k: st.one_of(v, v, json_values) for k, v in valid.items()},
                                 optional=optional or {})


coco_image = usually({"id": st.integers(0, 3), "file_name": st.sampled_from(["a.png", "b.png"]),
                      "width": st.just(8), "height": st.just(6)})
coco_ann = usually({"image_id": st.integers(0, 3), "category_id": st.integers(0, 3),
                    "bbox": st.lists(st.floats(-10, 20), min_size=4, max_size=4)},
                   optional={"id": json_values, "iscrowd": json_values})
coco_cat = usually({"id": st.integers(0, 3), "name": st.text(max_size=5)})
coco_docs = st.one_of(
    st.fixed_dictionaries({"images": st.lists(st.one_of(coco_image, coco_image, json_values), max_size=3),
                           "annotations": st.lists(st.one_of(coco_ann, coco_ann, json_values), max_size=4),
                           "categories": st.lists(st.one_of(coco_cat, coco_cat, json_values), max_size=3)}),
    st.fixed_dictionaries({"images": st.lists(coco_image, min_size=1, max_size=3),
                           "annotations": st.lists(coco_ann, max_size=4),
                           "categories": st.lists(coco_cat, min_size=1, max_size=3)}),
    json_values)


@settings(max_examples=80, **SETTINGS)
@given(train=coco_docs, val=coco_docs)
def test_random_coco_json(train, val):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for split in ("train", "val"):
            (root / split).mkdir()
            Image.new("RGB", (8, 6)).save(root / split / "a.png")
        (root / "train.json").write_text(json.dumps(train))
        (root / "val.json").write_text(json.dumps(val))
        y = root / "coco.yaml"
        y.write_text("format: coco\npath: .\ntrain: {images: train, annotations: train.json}\n"
                     "val: {images: val, annotations: val.json}\n")
        dataset_outcome(y)


# ---- options ----------------------------------------------------------------------------------------

anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-10**500, 10**500), st.floats(allow_nan=True),
    st.text(max_size=12), st.text(alphabet="0123456789,- ", max_size=12), st.binary(max_size=4),
    st.lists(st.one_of(st.integers(-5, 100), st.text(max_size=5), st.floats()), max_size=4),
    st.tuples(st.integers(-5, 10000), st.integers(-5, 10000)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([np.int64(7), np.float32(0.5), np.uint8(3), "true", "FALSE", "bf16", "fp16", "640",
                     "640,640", "person", "0,2", "1" * 5000, torch.float16, torch.int8, object()]),
)


@fast
@given(value=anything, stride=st.integers(1, 64), max_size=st.integers(1, 10000))
def test_check_imgsz(value, stride, max_size):
    try:
        out = options.check_imgsz(value, stride, max_size=max_size)
    except OptionError as e:
        assert str(e).startswith("imgsz") or "stride" in str(e), e
        return
    assert isinstance(out, int) and out >= 1 and out % stride == 0 and out <= max_size


@fast
@given(value=anything, lo=st.one_of(st.none(), st.integers(-5, 5)), span=st.one_of(st.none(), st.integers(0, 10)))
def test_check_int(value, lo, span):
    hi = None if span is None or lo is None else lo + span
    try:
        out = options.check_int("n", value, lo, hi)
    except OptionError as e:
        assert str(e).startswith("n must be an integer"), e
        return
    assert type(out) is int and (lo is None or out >= lo) and (hi is None or out <= hi)


@fast
@given(value=anything)
def test_fraction_float_bool_amp_choice(value):
    for fn, check in (
        (lambda v: options.check_fraction("conf", v), lambda r: type(r) is float and 0 <= r <= 1),
        (lambda v: options.check_float("lr0", v, 0.0, min_inclusive=False), lambda r: r > 0 and math.isfinite(r)),
        (lambda v: options.parse_bool("save", v), lambda r: type(r) is bool),
        (options.parse_amp, lambda r: r in (None, torch.float16, torch.bfloat16, options.AMP_FAMILY_DEFAULT)),
        (lambda v: options.check_choice("optimizer", v, ("SGD", "AdamW")), lambda r: r in ("SGD", "AdamW")),
    ):
        try:
            result = fn(value)
        except OptionError as e:
            assert str(e).split(" ", 1)[0] in ("conf", "lr0", "save", "amp", "optimizer"), e
            continue
        assert check(result), (value, result)


@fast
@given(value=st.one_of(anything, st.lists(st.one_of(st.integers(-3, 12), st.sampled_from(["a", "B", "c d", "7"])))),
       names=st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=12))
def test_parse_classes(value, names):
    try:
        out = options.parse_classes(value, dict(enumerate(names)))
    except OptionError as e:
        assert str(e).startswith("classes"), e
        return
    if value is None:
        assert out is None
        return
    assert out and all(type(i) is int and 0 <= i < len(names) for i in out) and len(set(out)) == len(out)
