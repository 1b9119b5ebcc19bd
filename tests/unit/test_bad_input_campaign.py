"""scripts/bad_input_campaign.py: how a case is judged, and (slow) a few of its kinds run whole."""
from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from libreyolo.graphs.runner import GraphUnavailableError

ROOT = Path(__file__).resolve().parents[2]


def _campaign():
    spec = importlib.util.spec_from_file_location("bad_input_campaign", ROOT / "scripts" / "bad_input_campaign.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


C = _campaign()


def _raise(exc: BaseException):
    def run():
        raise exc
    return run


def test_an_error_from_inside_torch_fails_the_case():
    def deep():
        return torch.empty(3, device="meta").item()
    out = C.judge(C.Case("sources", "meta", deep, ("meta",)))
    assert not out.held and "(at " in out.what


def test_the_librarys_own_error_classes_are_clear_and_their_message_is_judged():
    err = GraphUnavailableError("cuda_graph=True needs the model on a CUDA device")
    assert C.judge(C.Case("options", "graph", _raise(err), ("cuda",))).held
    assert not C.judge(C.Case("options", "graph", _raise(err), ("imgsz",))).held


def test_a_message_must_name_the_problem_and_not_a_forbidden_word():
    err = OSError("cannot save '/x/w.pt': [Errno 30] Read-only file system: '/x/.w.pt.abcd1234.tmp'")
    assert not C.judge(C.Case("writes", "ro", _raise(err), ("/x/w.pt",), forbid=(".tmp",))).held
    assert C.judge(C.Case("writes", "ro", _raise(OSError("cannot save '/x/w.pt'")), ("/x/w.pt",),
                          forbid=(".tmp",))).held


def test_no_error_where_one_is_due_fails_and_an_ok_case_runs_its_check():
    assert not C.judge(C.Case("options", "none", lambda: 1, ("x",))).held
    assert C.judge(C.Case("options", "ok", lambda: [1], ok=True, check=lambda r: None)).held
    out = C.judge(C.Case("options", "ok", list, ok=True, check=lambda r: "no result"))
    assert not out.held and out.what == "no result"


def test_said_reads_what_was_logged():
    def run():
        logging.getLogger("libreyolo.test").info("workers=1000 capped at 1: 2 CPU cores available")
        return [1]
    out = C.logged(run)
    assert C.said("capped at")(out) is None
    assert C.said("nothing like this")(out) is not None
    assert C.said("capped at", 2)(out) == "1 results, expected 2"


@pytest.mark.slow
def test_checkpoints_video_and_writes_hold(tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    rc = C.main(["--only", "checkpoints,video,writes", "--json", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    failed = [r for r in rows if not r["held"]]
    assert rc == 0 and not failed, failed
    assert {r["kind"] for r in rows} >= {"checkpoints", "video"}
