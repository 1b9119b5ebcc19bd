"""Validation of the public options, in one place, for the Python API and the CLI alike.

Every function here is pure (apart from one log warning in :func:`check_imgsz`): it takes the
value as the user gave it - a Python object, or the text of a ``key=value`` command-line
argument - and returns it in canonical form, or raises :class:`OptionError` (a ``ValueError``)
whose message names the option, repeats the value and states what is allowed::

    >>> check_fraction("conf", "abc")
    Traceback (most recent call last):
    ...
    libreyolo.options.OptionError: conf must be a number in [0, 1], got 'abc'

Numbers given as text (``"0.25"``, ``"640"``) are accepted so that the CLI needs no parsing of
its own; booleans are never taken for numbers (``True`` is not ``1`` here).
"""

from __future__ import annotations

import difflib
import logging
import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

__all__ = [
    "AMP_FAMILY_DEFAULT",
    "BOOL_FALSE",
    "BOOL_TRUE",
    "DEFAULT_MAX_NMS",
    "LOGGERS",
    "MAX_DET",
    "MAX_IMGSZ",
    "MAX_SEED",
    "MAX_WORKERS",
    "UNSET",
    "Bool",
    "Check",
    "Choice",
    "Custom",
    "Float",
    "Fraction",
    "Int",
    "OptionError",
    "OptionInfo",
    "Text",
    "check_choice",
    "check_classes_text",
    "check_fields",
    "check_float",
    "check_fraction",
    "check_imgsz",
    "check_int",
    "check_max_det",
    "check_seed",
    "did_you_mean",
    "option",
    "option_fields",
    "parse_amp",
    "parse_bool",
    "parse_cache",
    "parse_classes",
    "parse_freeze",
    "parse_loggers",
]

LOGGER = logging.getLogger(__name__)

#: Largest accepted image size. Activation memory grows with its square: a YOLO at 8192 needs
#: about 160x the memory of one at 640, which is already tens of GiB for training.
MAX_IMGSZ = 8192

#: Largest accepted ``seed``: numpy's seeding (``np.random.seed``, which training calls) takes
#: 32-bit unsigned seeds.
MAX_SEED = 2**32 - 1

#: Largest accepted ``max_det``. Every image gets a fixed (max_det, 6) detection tensor (the
#: captured graph's and the ONNX export's output shape), so the bound keeps that allocation sane
#: (100,000 rows: 2.4 MB an image); no head proposes more useful boxes than that.
MAX_DET = 100_000

#: Largest accepted ``workers`` (DataLoader workers): a value up to this is capped to what the
#: machine and the dataset can use, with one log line (``engine.loaders.cap_workers``); beyond
#: it the number is no plausible request and is refused.
MAX_WORKERS = 1_000_000

#: ``max_nms`` (candidates per image entering NMS) when it is not given: this, or ``max_det`` when
#: that is larger (NMS cannot keep more boxes than it is given).
DEFAULT_MAX_NMS = 1000

#: Spellings :func:`parse_bool` accepts (compared case-insensitively, surrounding blanks ignored).
BOOL_TRUE = ("true", "1", "yes", "on")
BOOL_FALSE = ("false", "0", "no", "off")


class OptionError(ValueError):
    """A public option has a value outside what it accepts; the message says which and why."""


class _FamilyDefault:
    """Type of :data:`AMP_FAMILY_DEFAULT`."""

    _instance: _FamilyDefault | None = None

    def __new__(cls) -> _FamilyDefault:  # a singleton, so that ``is`` comparisons survive copies
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "AMP_FAMILY_DEFAULT"

    def __reduce__(self) -> str:
        return "AMP_FAMILY_DEFAULT"


#: What :func:`parse_amp` returns for ``amp=True`` when no ``family_default`` is given: "autocast
#: in the model family's own dtype" (``Model.AMP_DTYPE``), to be resolved by the caller.
AMP_FAMILY_DEFAULT = _FamilyDefault()

# warnings already given by check_imgsz: (name, size, stride), so a predict loop logs once
_IMGSZ_WARNED: set[tuple[str, int, int]] = set()


def _show(value: Any) -> str:
    """The value as it appears in an error message (repr, shortened)."""
    try:
        text = repr(value)
    except Exception:  # e.g. an int of more digits than Python prints
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _as_int(value: Any) -> int | None:
    """``value`` as an int if it is one (an integral number or its text), else None. Booleans
    and non-integral floats are not ints."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        try:
            return int(value)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            return None
    return None


def _as_float(value: Any) -> float | None:
    """``value`` as a float if it is a real number (or its text), else None (booleans too)."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, numbers.Real):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
    except (ValueError, OverflowError):  # not a number; an int too large for a float
        return None
    return None


def did_you_mean(unknown: Iterable[str], known: Iterable[str]) -> str:
    """``" (did you mean 'epochs'?)"`` for the ``unknown`` names close to a ``known`` one (each
    named, ``'epochs' for 'epoch'``, where several are unknown); ``""`` where none is close."""
    unknown, known = list(unknown), list(known)
    hits = [(u, close[0]) for u in unknown if (close := difflib.get_close_matches(u, known, n=1))]
    if not hits:
        return ""
    if len(unknown) == 1:
        return f" (did you mean {hits[0][1]!r}?)"
    return " (did you mean " + ", ".join(f"{k!r} for {u!r}" for u, k in hits) + "?)"


# --------------------------------------------------------------------------------------------------
# Numbers


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (either bound may be None: unbounded).

    Accepts ints (numpy's too), whole floats (``16.0``) and their text (``"16"``); rejects
    booleans, fractions (``2.5``) and anything else, naming ``name`` and the value.
    """
    n = _as_int(value)
    if minimum is not None and maximum is not None:
        allowed = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        allowed = f"an integer >= {minimum}"
    elif maximum is not None:
        allowed = f"an integer <= {maximum}"
    else:
        allowed = "an integer"
    if n is None or (minimum is not None and n < minimum) or (maximum is not None and n > maximum):
        raise OptionError(f"{name} must be {allowed}, got {_show(value)}")
    return n


def check_seed(value: Any, name: str = "seed") -> int:
    """A random seed: an int in ``[0, MAX_SEED]`` (the range numpy's seeding accepts)."""
    return check_int(name, value, 0, MAX_SEED)


def check_max_det(max_det: Any, max_nms: Any = None) -> tuple[int, int]:
    """``(max_det, max_nms)`` of detection's predict and export, checked together.

    ``max_det`` (detections kept per image) is an int in ``[1, MAX_DET]``. ``max_nms``
    (candidates per image entering NMS) is an int >= ``max_det`` when given; None - not given -
    means :data:`DEFAULT_MAX_NMS`, raised to ``max_det`` when that is larger, so a large
    ``max_det`` never fails on a default the caller did not choose.
    """
    det = check_int("max_det", max_det, 1, MAX_DET)
    if max_nms is None:
        return det, max(DEFAULT_MAX_NMS, det)
    nms = check_int("max_nms", max_nms, 1)
    if nms < det:
        raise OptionError(f"max_nms={nms} is smaller than max_det={det}: NMS keeps at most max_nms candidates "
                          f"per image, so give max_nms >= max_det (or leave max_nms out: it follows max_det)")
    return det, nms


def check_float(name: str, value: Any, minimum: float | None = None, maximum: float | None = None,
                *, min_inclusive: bool = True, max_inclusive: bool = True) -> float:
    """``value`` as a finite float within the given bounds (None: unbounded on that side).

    Accepts ints, floats and their text; rejects booleans, NaN, infinities and anything else.
    """
    x = _as_float(value)
    lo = "" if minimum is None else ("[" if min_inclusive else "(") + f"{minimum:g}"
    hi = "" if maximum is None else f"{maximum:g}" + ("]" if max_inclusive else ")")
    if lo and hi:
        allowed = f"a number in {lo}, {hi}"
    elif lo:
        allowed = f"a number {'>=' if min_inclusive else '>'} {minimum:g}"
    elif hi:
        allowed = f"a number {'<=' if max_inclusive else '<'} {maximum:g}"
    else:
        allowed = "a finite number"
    ok = (x is not None and math.isfinite(x)
          and (minimum is None or (x >= minimum if min_inclusive else x > minimum))
          and (maximum is None or (x <= maximum if max_inclusive else x < maximum)))
    if x is None or not ok:
        raise OptionError(f"{name} must be {allowed}, got {_show(value)}")
    return float(x)


def check_fraction(name: str, value: Any) -> float:
    """``value`` as a float in [0, 1]: thresholds (``conf``, ``iou``) and probabilities."""
    return check_float(name, value, 0.0, 1.0)


def check_imgsz(value: Any, stride: int = 1, name: str = "imgsz", max_size: int = MAX_IMGSZ) -> int:
    """The image size as one int, a multiple of ``stride``.

    ``value`` is a positive int, its text, or a square pair (``(640, 640)``, ``"640,640"``); a
    non-square pair is refused (only square inputs are supported). A size that is not a multiple
    of ``stride`` is rounded UP to the next multiple, with one warning per size and stride (the
    same rule for predict, train and val, so a model trained at a size predicts at it). Sizes
    above ``max_size`` are refused before anything is allocated.
    """
    if isinstance(stride, bool) or not isinstance(stride, numbers.Integral) or stride < 1:
        raise OptionError(f"stride must be a positive integer, got {_show(stride)}")
    stride = int(stride)
    given = value
    if isinstance(value, str) and "," in value:
        value = [v for v in value.split(",")]
    if isinstance(value, Sequence) and not isinstance(value, str):
        sides = [_as_int(v) for v in value]
        if not 1 <= len(sides) <= 2 or any(s is None for s in sides):
            raise OptionError(f"{name} must be a positive integer or a square pair (n, n), "
                              f"got {_show(given)}")
        if len(set(sides)) != 1:
            raise OptionError(f"{name}={_show(given)} is not square: only square sizes are "
                              f"supported, e.g. {name}={max(sides)}")  # type: ignore[type-var]
        size = sides[0]
    else:
        size = _as_int(value)
    if size is None or size < 1:
        raise OptionError(f"{name} must be a positive integer (pixels), got {_show(given)}")
    aligned = -(-size // stride) * stride
    if aligned > max_size:
        raise OptionError(f"{name}={_show(size)} is too large: at most {max_size} (memory grows with "
                          "the square of the size)")
    if aligned != size:
        key = (name, size, stride)
        level = logging.DEBUG if key in _IMGSZ_WARNED else logging.WARNING
        _IMGSZ_WARNED.add(key)
        LOGGER.log(level, "%s=%d is not a multiple of the stride %d; using %d",
                   name, size, stride, aligned)
    return aligned


# --------------------------------------------------------------------------------------------------
# Words


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """``value`` as the matching entry of ``choices`` (compared case-insensitively)."""
    options = list(choices)
    if isinstance(value, str):
        for c in options:
            if c.lower() == value.strip().lower():
                return c
    raise OptionError(f"{name} must be one of {', '.join(options)}, got {_show(value)}")


def parse_bool(name: str, value: Any) -> bool:
    """``value`` as a bool: a bool, 0/1, or one of :data:`BOOL_TRUE` / :data:`BOOL_FALSE`
    (any case). Anything else - ``"flase"``, ``2``, ``""`` - is refused, listing the spellings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(value)
    if isinstance(value, str):
        s = value.strip().lower()
        if s in BOOL_TRUE:
            return True
        if s in BOOL_FALSE:
            return False
    raise OptionError(f"{name} must be true or false (accepted: {'/'.join(BOOL_TRUE)} and "
                      f"{'/'.join(BOOL_FALSE)}, any case), got {_show(value)}")


_AMP_FP16 = ("fp16", "float16", "half")
_AMP_BF16 = ("bf16", "bfloat16")


def parse_cache(value: Any) -> str | bool:
    """``cache``: False (and the false spellings), "ram" (True means it), "disk" or "auto" (RAM
    when the images fit a share of the free memory)."""
    if isinstance(value, str) and value.strip().lower() in ("ram", "disk", "auto"):
        return value.strip().lower()
    try:
        return "ram" if parse_bool("cache", value) else False
    except OptionError:
        raise OptionError(f"cache must be ram, disk, auto or false, got {value!r}") from None


def parse_amp(value: Any, family_default: Any = AMP_FAMILY_DEFAULT) -> Any:
    """The autocast dtype ``amp`` asks for: None (off), ``torch.float16`` or ``torch.bfloat16``.

    Off: False, None, 0 and the false spellings of :func:`parse_bool` (and ``"none"``).
    ``fp16``/``float16``/``half``/``torch.float16`` and ``bf16``/``bfloat16``/``torch.bfloat16``
    choose a dtype. True (1, or a true spelling) means "the family's default autocast dtype" and
    returns ``family_default``: pass the model's ``AMP_DTYPE``, or leave it to get
    :data:`AMP_FAMILY_DEFAULT` back and resolve it later.
    """
    import torch

    if value is None or value is torch.float32:
        return None
    if value is torch.float16:
        return torch.float16
    if value is torch.bfloat16:
        return torch.bfloat16
    if isinstance(value, str):
        s = value.strip().lower()
        if s in _AMP_FP16:
            return torch.float16
        if s in _AMP_BF16:
            return torch.bfloat16
        if s == "none":
            return None
    try:
        on = parse_bool("amp", value)
    except OptionError:
        raise OptionError(
            f"amp must be false, true (the family's autocast dtype), fp16/float16/half or "
            f"bf16/bfloat16 (true/false also as {'/'.join(BOOL_TRUE)} and {'/'.join(BOOL_FALSE)}), "
            f"got {_show(value)}"
        ) from None
    return family_default if on else None


# --------------------------------------------------------------------------------------------------
# Classes


def parse_classes(value: Any, names: Mapping[int, str] | Sequence[str]) -> list[int] | None:
    """``classes=`` as a list of class ids (in the given order, duplicates dropped), or None.

    Accepted: None (every class); a class id (``3``); a class name (``"person"``); a sequence of
    ids and/or names; a comma-separated string of them (``"0,2"``, ``"person, car"``). Text that
    is a whole number is an id - ``"34"`` is class 34, never 3 and 4 -, other text must be a
    class name (exact, else case-insensitive). Fractions (``0.7``), booleans, empty selections,
    unknown names and ids outside ``0..nc-1`` are refused, naming the value and the range.
    """
    if value is None:
        return None
    table = dict(enumerate(names)) if not isinstance(names, Mapping) else dict(names)
    nc = len(table)
    by_name = {str(n): int(i) for i, n in table.items()}
    by_lower: dict[str, list[int]] = {}
    for key, i in by_name.items():
        by_lower.setdefault(key.lower(), []).append(i)

    def one(item: Any, where: str) -> int:
        if isinstance(item, str):
            text = item.strip()
            n = _as_int(text)
            if n is None:
                if text in by_name:
                    return by_name[text]
                hits = by_lower.get(text.lower(), [])
                if len(hits) == 1:
                    return hits[0]
                close = difflib.get_close_matches(text, list(by_name), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise OptionError(f"classes: {where}{_show(item)} is not a class id nor one of this "
                                  f"model's {nc} class names{hint}")
        else:
            n = _as_int(item) if isinstance(item, numbers.Integral) else None
            if n is None:
                raise OptionError(f"classes: {where}{_show(item)} is not a class id (an integer) or "
                                  "a class name")
        if not 0 <= n < nc:
            raise OptionError(f"classes: {where}{_show(n)} is out of range: this model has {nc} classes "
                              f"(ids 0..{nc - 1})")
        return n

    if isinstance(value, str):
        text = value.strip()
        if text in by_name or _as_int(text) is not None:
            items: list[Any] = [text]
        else:
            items = [t for t in text.split(",")]
            if any(not t.strip() for t in items):
                raise OptionError(f"classes={_show(value)} has an empty entry: give ids or names "
                                  "separated by commas, e.g. classes=0,2")
    elif isinstance(value, (Sequence, set, frozenset)) and not isinstance(value, (bytes, bytearray)):
        items = list(value) if not isinstance(value, (set, frozenset)) else sorted(value, key=str)
        for x in items:
            if isinstance(x, (list, tuple, set, frozenset)):
                raise OptionError(f"classes must be a flat list of ids or names, got {_show(value)}")
    elif isinstance(value, numbers.Number):  # one id; a float or a bool is refused by one()
        items = [value]
    else:
        raise OptionError(f"classes must be None, a class id, a class name or a list of them, got "
                          f"{_show(value)} ({type(value).__name__})")
    if not items:
        raise OptionError("classes is empty: pass None for every class, or the ids/names to keep")
    ids: list[int] = []
    for i, item in enumerate(items):
        n = one(item, "" if len(items) == 1 else f"entry {i}: ")
        if n not in ids:
            ids.append(n)
    return ids


def check_classes_text(name: str, value: Any) -> Any:
    """``classes`` before the model is known: returned as given (ids and names are resolved
    against the model's names by :func:`parse_classes` when it runs); text with an empty entry is
    refused at once, with :func:`parse_classes`'s message."""
    if isinstance(value, str) and any(not t.strip() for t in value.split(",")):
        raise OptionError(f"{name}={_show(value)} has an empty entry: give ids or names separated by commas, "
                          f"e.g. {name}=0,2")
    return value


# --------------------------------------------------------------------------------------------------
# Training conveniences


def parse_freeze(value: Any) -> int | list[str] | None:
    """``freeze=`` as None (nothing frozen), a layer count N (the first N layers of the network),
    or a list of parameter-name prefixes (``["backbone", "neck.elan_up1"]``).

    Accepted: None, False, 0 (nothing); an integer >= 0 or its text; a comma-separated string of
    prefixes (``"backbone,neck.down1"``); a sequence of prefix strings. Whether the count or the
    prefixes fit the network is checked by the trainer, which knows it.
    """
    if value is None or value is False:
        return None
    n = _as_int(value)
    if n is not None:
        if n < 0:
            raise OptionError(f"freeze must be an integer >= 0 (layers), or parameter-name prefixes, got {_show(value)}")
        return n or None
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        items = list(value)
    else:
        raise OptionError(f"freeze must be an integer >= 0 (the first N layers) or parameter-name prefixes "
                          f"(e.g. freeze=backbone,neck.down1), got {_show(value)}")
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip() or item.strip() != item.strip().strip("."):
            raise OptionError(f"freeze: {_show(item)} is not a parameter-name prefix (a non-empty name such as "
                              f"'backbone' or 'neck.down1'), in freeze={_show(value)}")
        if item.strip() not in out:
            out.append(item.strip())
    if not out:
        raise OptionError("freeze is an empty list: pass None (nothing frozen), a layer count or prefixes")
    return out


#: Experiment loggers ``loggers=`` may name.
LOGGERS = ("tensorboard", "mlflow", "wandb", "comet", "clearml", "dvclive")


def parse_loggers(value: Any) -> tuple[str, ...]:
    """``loggers=`` as a tuple of logger names from :data:`LOGGERS` (empty: none).

    Accepted: None, False, ``""`` or ``"none"`` (none); a name (``"tensorboard"``); a
    comma-separated string or a sequence of names. Whether a logger's package is installed is
    checked when the run starts.
    """
    if value is None or value is False:
        return ()
    if isinstance(value, str):
        items: list[Any] = [] if value.strip().lower() in ("", "none") else value.split(",")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        items = list(value)
    else:
        raise OptionError(f"loggers must be none or one or more of {', '.join(LOGGERS)}, got {_show(value)}")
    out: list[str] = []
    for item in items:
        name = check_choice("loggers", item, LOGGERS)
        if name not in out:
            out.append(name)
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# Options as data
#
# Every public option is a field of an options dataclass (engine.config's training groups, each
# task's Options, engine.call_options' predict/val/export options) declared with :func:`option`:
# its default, its help and a :class:`Check`. The CLI's parser and --help, the docs' options table
# (docs/options.md) and the Python checks (:func:`check_fields`) are made from those fields, so an
# option is declared once and takes the same values, with the same messages, everywhere.


class _Unset:
    """Type of :data:`UNSET`."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "UNSET"


#: The default of an option whose default belongs to someone else (a task's predict option: the
#: task's own default applies unless the option is given).
UNSET = _Unset()


class Check:
    """How one option's value is checked: ``check(name, value)`` returns the value in canonical
    form or raises :class:`OptionError` naming the option.

    ``text`` says what is accepted (the docs' and the help's wording). ``none``: None is accepted
    as it is ("not given: decided elsewhere", e.g. the family's learning rate); on the command line
    ``auto`` or ``none`` give it. ``cli``: the conversion of a command-line argument's text when it
    differs from the check (default: the check itself, which takes numbers and booleans as text).
    """

    def __init__(self, fn: Callable[[str, Any], Any], text: str, *, none: bool = False,
                 cli: Callable[[str, str], Any] | None = None, bounds: tuple[Any, Any] | None = None,
                 choices: tuple[str, ...] | None = None, free: bool = False):
        self.fn, self.text, self.none, self._cli = fn, text, none, cli
        #: free text (a path, a name): taken as given, checked where it is used
        self.free = free
        #: (minimum, maximum) of a number (either may be None), the accepted words of a choice
        self.bounds, self.choices = bounds, choices

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.none:
            return None
        return self.fn(name, value)

    def parse(self, name: str, text: str) -> Any:
        """The value of a command-line ``name=text``."""
        if self.none and not self.free and str(text).strip().lower() in ("auto", "none"):
            return None
        return (self._cli or self.fn)(name, text)

    def optional(self) -> Check:
        """This check, accepting None too."""
        return Check(self.fn, self.text, none=True, cli=self._cli, bounds=self.bounds, choices=self.choices,
                     free=self.free)

    def __repr__(self) -> str:
        return f"Check({self.text!r}{', none' if self.none else ''})"


def Int(minimum: int | None = None, maximum: int | None = None, *, none: bool = False) -> Check:
    """An integer in ``[minimum, maximum]`` (:func:`check_int`)."""
    if minimum is not None and maximum is not None:
        text = f"integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        text = f"integer >= {minimum}"
    elif maximum is not None:
        text = f"integer <= {maximum}"
    else:
        text = "integer"
    return Check(lambda n, v: check_int(n, v, minimum, maximum), text, none=none, bounds=(minimum, maximum))


def Float(minimum: float | None = None, maximum: float | None = None, *, min_inclusive: bool = True,
          max_inclusive: bool = True, none: bool = False) -> Check:
    """A finite number within the bounds (:func:`check_float`)."""
    lo = "" if minimum is None else ("[" if min_inclusive else "(") + f"{minimum:g}"
    hi = "" if maximum is None else f"{maximum:g}" + ("]" if max_inclusive else ")")
    if lo and hi:
        text = f"number in {lo}, {hi}"
    elif lo:
        text = f"number {'>=' if min_inclusive else '>'} {minimum:g}"
    elif hi:
        text = f"number {'<=' if max_inclusive else '<'} {maximum:g}"
    else:
        text = "number"
    return Check(lambda n, v: check_float(n, v, minimum, maximum, min_inclusive=min_inclusive,
                                          max_inclusive=max_inclusive), text, none=none,
                 bounds=(minimum, maximum))


def Fraction(*, none: bool = False) -> Check:
    """A number in [0, 1] (:func:`check_fraction`)."""
    return Check(check_fraction, "number in [0, 1]", none=none, bounds=(0.0, 1.0))


def Bool(*, none: bool = False) -> Check:
    """true or false (:func:`parse_bool`)."""
    return Check(parse_bool, "true or false", none=none)


def Choice(*choices: str, none: bool = False) -> Check:
    """One of ``choices``, any case (:func:`check_choice`)."""
    return Check(lambda n, v: check_choice(n, v, choices), "one of " + ", ".join(choices), none=none,
                 choices=tuple(choices))


def _text(name: str, value: Any) -> Any:
    return value


def Text(text: str = "text", *, none: bool = True) -> Check:
    """Free text (a path, a name, a device): taken as given; its meaning is checked where used."""
    return Check(_text, text, none=none, free=True)


def Custom(fn: Callable[[str, Any], Any], text: str, *, none: bool = False,
           cli: Callable[[str, str], Any] | None = None) -> Check:
    """A check of its own: ``fn(name, value)``, e.g. a ``parse_*`` function of this module."""
    return Check(fn, text, none=none, cli=cli)


def option(default: Any, help: str, check: Check | None = None, **meta: Any) -> Any:
    """A dataclass field declaring one public option: its ``default``, its ``help`` (one line, as
    the CLI's --help and the docs show it; say "default" in it when the default needs words, e.g.
    "the family's") and its :class:`Check`. ``meta``: more about it, e.g. ``tasks=("detect",)``
    for an option some tasks take, ``cli=False`` for one the command line does not offer."""
    return field(default=default, metadata={"help": help, "check": check, **meta})


@dataclass(frozen=True)
class OptionInfo:
    """One option as :func:`option_fields` reads it from its dataclass."""

    name: str
    default: Any
    help: str
    check: Check | None
    meta: Mapping[str, Any]

    def parse(self, text: str) -> Any:
        """The value of the command-line argument ``name=text``."""
        return self.check.parse(self.name, text) if self.check is not None else text


def option_fields(cls: Any) -> list[OptionInfo]:
    """The options a dataclass (or an instance) declares, in field order."""
    out = []
    for f in fields(cls):
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else None)  # type: ignore[misc]
        out.append(OptionInfo(f.name, default, f.metadata.get("help", ""), f.metadata.get("check"),
                              {k: v for k, v in f.metadata.items() if k not in ("help", "check")}))
    return out


def check_fields(obj: Any, names: Iterable[str] | None = None) -> None:
    """Check the options of a dataclass instance ``obj`` in place (each field's :class:`Check`;
    ``names``: only these). A field left at :data:`UNSET` is not checked."""
    wanted = None if names is None else set(names)
    for f in fields(obj):
        check = f.metadata.get("check")
        if check is None or (wanted is not None and f.name not in wanted):
            continue
        value = getattr(obj, f.name)
        if value is UNSET:
            continue
        setattr(obj, f.name, check(f.name, value))
