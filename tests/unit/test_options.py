"""libreyolo.options: every validator's accepted forms, its refusals and their messages."""

from __future__ import annotations

import logging
import pickle
import re

import numpy as np
import pytest
import torch

from libreyolo import options
from libreyolo.options import (
    AMP_FAMILY_DEFAULT,
    MAX_IMGSZ,
    OptionError,
    check_choice,
    check_float,
    check_fraction,
    check_imgsz,
    check_int,
    parse_amp,
    parse_bool,
    parse_classes,
)

NAMES = {0: "person", 1: "bicycle", 2: "car", 3: "Traffic Light", 4: "a, b"}
NAMES.update({i: f"class{i}" for i in range(5, 80)})


@pytest.fixture(autouse=True)
def _fresh_imgsz_warnings():
    options._IMGSZ_WARNED.clear()
    yield
    options._IMGSZ_WARNED.clear()


def test_option_error_is_a_value_error():
    assert issubclass(OptionError, ValueError)


# ---- imgsz ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, stride, expected", [
    (640, 32, 640), ("640", 32, 640), (640.0, 32, 640), (np.int64(320), 32, 320), ((640, 640), 32, 640),
    ([320], 32, 320), ("512,512", 32, 512), (600, 32, 608), (1, 32, 32), (600, 64, 640), (224, 14, 224),
    (230, 14, 238), (7, 1, 7),
])
def test_imgsz_accepted_forms_round_up_to_the_stride(value, stride, expected):
    assert check_imgsz(value, stride) == expected


def test_imgsz_rounding_warns_once_per_size_and_stride(caplog):
    with caplog.at_level(logging.DEBUG, logger="libreyolo"):
        for _ in range(3):
            assert check_imgsz(600, 32) == 608
        check_imgsz(600, 64)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "imgsz=600 is not a multiple of the stride 32; using 608",
        "imgsz=600 is not a multiple of the stride 64; using 640"]


def test_imgsz_on_a_multiple_logs_nothing(caplog):
    with caplog.at_level(logging.DEBUG, logger="libreyolo"):
        check_imgsz(640, 32)
    assert caplog.records == []


@pytest.mark.parametrize("value, needle", [
    (0, "imgsz must be a positive integer (pixels), got 0"),
    (-32, "got -32"),
    (100000, f"imgsz=100000 is too large: at most {MAX_IMGSZ}"),
    ((640, 480), "imgsz=(640, 480) is not square: only square sizes are supported, e.g. imgsz=640"),
    ("640,480", "is not square"),
    ("abc", "got 'abc'"),
    (True, "got True"),
    (12.5, "got 12.5"),
    (None, "got None"),
    ((640, 640, 640), "a square pair (n, n), got (640, 640, 640)"),
    (("a", "b"), "a square pair"),
    ((), "a square pair"),
])
def test_imgsz_refusals_name_the_option_and_value(value, needle):
    with pytest.raises(OptionError, match=re.escape(needle)):
        check_imgsz(value, 32)


def test_imgsz_custom_name_and_limit():
    with pytest.raises(OptionError, match=re.escape("size=2048 is too large: at most 1024")):
        check_imgsz(2048, 32, name="size", max_size=1024)
    with pytest.raises(OptionError, match="too large"):  # the rounded size counts
        check_imgsz(1000, 64, max_size=1000)
    with pytest.raises(OptionError, match="stride must be a positive integer"):
        check_imgsz(640, 0)


# ---- numbers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [(0, 0.0), (1, 1.0), (0.25, 0.25), ("0.7", 0.7), (np.float32(0.5), 0.5)])
def test_fraction_accepted(value, expected):
    assert check_fraction("conf", value) == pytest.approx(expected)


@pytest.mark.parametrize("value", [5, -0.1, 1.0001, "abc", "", None, True, float("nan"), float("inf"), [0.5]])
def test_fraction_refused_naming_option_range_and_value(value):
    with pytest.raises(OptionError) as info:
        check_fraction("iou", value)
    assert str(info.value) == f"iou must be a number in [0, 1], got {value!r}"


def test_check_float_bounds():
    assert check_float("lr0", "1e-3", 0.0, min_inclusive=False) == 1e-3
    with pytest.raises(OptionError, match=re.escape("lr0 must be a number > 0, got 0")):
        check_float("lr0", 0, 0.0, min_inclusive=False)
    with pytest.raises(OptionError, match=re.escape("scale must be a number in [0, 1), got 1")):
        check_float("scale", 1, 0.0, 1.0, max_inclusive=False)
    with pytest.raises(OptionError, match=re.escape("x must be a number <= 2, got 3")):
        check_float("x", 3, maximum=2)
    with pytest.raises(OptionError, match=re.escape("x must be a finite number, got inf")):
        check_float("x", float("inf"))


@pytest.mark.parametrize("name, value, minimum, expected", [
    ("epochs", 10, 1, 10), ("epochs", "10", 1, 10), ("batch", 16.0, 1, 16), ("workers", 0, 0, 0),
    ("runs", np.int32(3), 1, 3), ("seed", "-5", None, -5),
])
def test_int_accepted(name, value, minimum, expected):
    assert check_int(name, value, minimum) == expected


@pytest.mark.parametrize("name, value, minimum, needle", [
    ("epochs", 0, 1, "epochs must be an integer >= 1, got 0"),
    ("batch", -4, 1, "batch must be an integer >= 1, got -4"),
    ("workers", -1, 0, "workers must be an integer >= 0, got -1"),
    ("nc", 2.5, 1, "nc must be an integer >= 1, got 2.5"),
    ("runs", "many", 1, "runs must be an integer >= 1, got 'many'"),
    ("epochs", True, 1, "epochs must be an integer >= 1, got True"),
    ("epochs", None, 1, "got None"),
])
def test_int_refused(name, value, minimum, needle):
    with pytest.raises(OptionError, match=re.escape(needle)):
        check_int(name, value, minimum)


def test_int_upper_bound_message():
    assert check_int("k", 5, 1, 5) == 5
    with pytest.raises(OptionError, match=re.escape("k must be an integer in [1, 5], got 6")):
        check_int("k", 6, 1, 5)
    with pytest.raises(OptionError, match=re.escape("k must be an integer <= 5, got 6")):
        check_int("k", 6, maximum=5)


def test_check_choice():
    assert check_choice("optimizer", "adamw", ("SGD", "AdamW")) == "AdamW"
    with pytest.raises(OptionError, match=re.escape("optimizer must be one of SGD, AdamW, got 'adam'")):
        check_choice("optimizer", "adam", ("SGD", "AdamW"))


# ---- booleans and amp -------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), (1, True), (0, False), ("true", True), ("TRUE", True), (" Yes ", True),
    ("on", True), ("1", True), ("false", False), ("No", False), ("OFF", False), ("0", False),
])
def test_parse_bool_accepted(value, expected):
    assert parse_bool("save", value) is expected


@pytest.mark.parametrize("value", ["flase", "ture", "", "2", 2, -1, None, 0.5, "y"])
def test_parse_bool_refused_listing_spellings(value):
    with pytest.raises(OptionError) as info:
        parse_bool("save", value)
    msg = str(info.value)
    assert msg.startswith("save must be true or false") and msg.endswith(f"got {value!r}")
    assert "true/1/yes/on" in msg and "false/0/no/off" in msg


@pytest.mark.parametrize("value, expected", [
    (False, None), (None, None), (0, None), ("false", None), ("off", None), ("none", None),
    ("fp16", torch.float16), ("float16", torch.float16), ("HALF", torch.float16), (torch.float16, torch.float16),
    ("bf16", torch.bfloat16), ("BFloat16", torch.bfloat16), (torch.bfloat16, torch.bfloat16),
    (True, AMP_FAMILY_DEFAULT), ("true", AMP_FAMILY_DEFAULT), (1, AMP_FAMILY_DEFAULT), ("yes", AMP_FAMILY_DEFAULT),
])
def test_parse_amp(value, expected):
    assert parse_amp(value) is expected


def test_parse_amp_true_is_the_given_family_default():
    assert parse_amp(True, torch.bfloat16) is torch.bfloat16
    assert parse_amp("on", family_default=torch.float16) is torch.float16
    assert parse_amp("bf16", torch.float16) is torch.bfloat16  # an explicit dtype wins
    assert parse_amp(False, torch.float16) is None


@pytest.mark.parametrize("value", ["flase", "fp8", "float32x", 2, 0.5, torch.int8])
def test_parse_amp_refused(value):
    with pytest.raises(OptionError, match=r"^amp must be false, true \(the family's autocast dtype\), "
                                          r"fp16/float16/half or bf16/bfloat16.*got "):
        parse_amp(value)


def test_family_default_sentinel_survives_pickling():
    assert pickle.loads(pickle.dumps(AMP_FAMILY_DEFAULT)) is AMP_FAMILY_DEFAULT
    assert repr(AMP_FAMILY_DEFAULT) == "AMP_FAMILY_DEFAULT"


# ---- classes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (None, None),
    (3, [3]),
    (np.int64(7), [7]),
    ("34", [34]),                     # one id, not 3 and 4
    (" 34 ", [34]),
    ("3,4", [3, 4]),
    ("0, 2 ,1", [0, 2, 1]),
    ([0, 2], [0, 2]),
    ((2, 0, 2), [2, 0]),              # order kept, duplicates dropped
    ("person", [0]),
    ("traffic light", [3]),           # case-insensitive when unambiguous
    ("person,car", [0, 2]),
    (["car", 1, "7"], [2, 1, 7]),
    ("a, b", [4]),                    # a whole class name wins over splitting at its comma
    ({1, 0}, [0, 1]),
])
def test_parse_classes_accepted(value, expected):
    assert parse_classes(value, NAMES) == expected


@pytest.mark.parametrize("value, needle", [
    (0.7, "classes: 0.7 is not a class id (an integer) or a class name"),
    ([0.7], "classes: 0.7 is not a class id"),
    ([1, 2.0], "classes: entry 1: 2.0 is not a class id"),
    (True, "classes: True is not a class id"),
    (80, "classes: 80 is out of range: this model has 80 classes (ids 0..79)"),
    (-1, "classes: -1 is out of range"),
    ("81", "classes: 81 is out of range"),
    ([1, 99], "classes: entry 1: 99 is out of range"),
    ("persn", "classes: 'persn' is not a class id nor one of this model's 80 class names; did you mean 'person'?"),
    ("dragon", "classes: 'dragon' is not a class id nor one of this model's 80 class names"),
    ("1,,2", "has an empty entry"),
    ([], "classes is empty: pass None for every class"),
    ([[1, 2]], "a flat list"),
    (b"3", "classes must be None, a class id, a class name or a list of them, got b'3' (bytes)"),
    (np.array([1, 2]), "classes must be None, a class id"),
])
def test_parse_classes_refused(value, needle):
    with pytest.raises(OptionError, match=re.escape(needle)):
        parse_classes(value, NAMES)


def test_parse_classes_names_as_a_list_and_ambiguous_case():
    assert parse_classes("b", ["a", "b", "c"]) == [1]
    with pytest.raises(OptionError, match="not a class id nor one of this model's 2 class names"):
        parse_classes("cat", ["Cat", "CAT"])  # two case-insensitive matches: refuse rather than guess
    assert parse_classes("Cat", ["Cat", "CAT"]) == [0]
