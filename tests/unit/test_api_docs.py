"""The public entry points' ``Args:`` sections (what an IDE shows for ``predict``, ``train``, ...)
name exactly the options the calls take: every field of the option dataclasses, and nothing that
is no longer one."""
from __future__ import annotations

import inspect
import re
from dataclasses import fields

import pytest

from libreyolo import LibreYOLO
from libreyolo.engine.call_options import ExportOptions, PredictOptions, TrackOptions, ValOptions
from libreyolo.engine.config import GROUPS
from libreyolo.models.base import Model
from libreyolo.tasks import TASKS, get_task


def args_names(fn) -> list[str]:
    """The names of a Google-style docstring's ``Args:`` entries (``**kwargs`` as ``kwargs``)."""
    doc = inspect.getdoc(fn) or ""
    match = re.search(r"^Args:\n((?:    .*\n|\n)*)", doc + "\n", re.MULTILINE)
    assert match, f"{fn.__qualname__} has no Args: section"
    return re.findall(r"^    (?:\*\*)?(\w+):", match.group(1), re.MULTILINE)


def names(*classes) -> set[str]:
    return {f.name for cls in classes for f in fields(cls)}


CASES = {
    "train": (Model.train, names(*GROUPS.values(), *(get_task(t).Options for t in TASKS)) | {"callbacks"}),
    "predict": (Model.predict, names(PredictOptions) | {"source", "on_results"}),
    "track": (Model.track, (names(TrackOptions) - names(PredictOptions)) | {"source", "conf", "kwargs"}),
    "val": (Model.val, names(ValOptions) | {"task_opts"}),
    "export": (Model.export, names(ExportOptions)),
    "LibreYOLO": (LibreYOLO, set(inspect.signature(LibreYOLO.__new__).parameters) - {"cls"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_args_section_names_every_option_once(case):
    fn, expected = CASES[case]
    got = args_names(fn)
    assert len(got) == len(set(got)), f"{case}: an option is listed twice: {got}"
    assert set(got) == expected, (f"{case}: missing from Args: {sorted(expected - set(got))}; "
                                  f"not an option: {sorted(set(got) - expected)}")


def test_call_is_predict():
    assert Model.__call__ is Model.predict
