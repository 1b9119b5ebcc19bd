"""The logging convention: every module logs through ``logging.getLogger(__name__)`` (children of
the ``libreyolo`` logger), no message carries a hand-written "libreyolo: " prefix, and the
command line's handler shows the prefix once per record of the package."""
from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
from pathlib import Path

import libreyolo
from libreyolo.logs import PrefixFormatter

PACKAGE = Path(libreyolo.__file__).resolve().parent
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}



def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        yield rel, ast.parse(path.read_text(encoding="utf-8"))


def _is_get_logger(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getLogger"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "logging")


def test_every_module_logs_through_its_own_logger():
    others = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if _is_get_logger(node):
                if not node.args:   # the root logger: read to see whether logging is set up
                    continue
                arg = node.args[0]
                if not (isinstance(arg, ast.Name) and arg.id == "__name__"):
                    others.append((rel, node.lineno))
    # one call names the package logger: logs.package_logger, for the few places that set its
    # level or add a handler; nothing logs through it
    lines = (PACKAGE / "logs.py").read_text(encoding="utf-8").splitlines()
    allowed = [(rel, n) for rel, n in others if rel == "logs.py" and lines[n - 1].strip() == "return logging.getLogger(PACKAGE)"]
    assert len(allowed) == 1
    assert [o for o in others if o not in allowed] == []


def test_no_message_carries_a_hand_written_prefix():
    bad = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_METHODS):
                continue
            for arg in node.args[:2]:   # log(level, msg) has the message second
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("libreyolo:"):
                    bad.append(f"{rel}:{node.lineno}: {arg.value[:60]!r}")
    assert bad == []


def _record(name: str, msg: str) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, ("x",), None)


def test_the_formatter_prefixes_the_package_records_once():
    f = PrefixFormatter()
    assert f.format(_record("libreyolo.data.video", "video %s ended")) == "libreyolo: video x ended"
    assert f.format(_record("libreyolo", "%s")) == "libreyolo: x"
    assert f.format(_record("libreyolo: epoch", "%s")) == "x"   # not a package logger's name
    assert f.format(_record("libreyolo.engine.trainer", "libreyolo: epoch %s")) == "libreyolo: epoch x"
    assert f.format(_record("torch.fx", "traced %s")) == "traced x"
    assert f.format(_record("libreyolox", "%s")) == "x"


def test_the_command_line_shows_a_module_record_with_the_prefix_once():
    code = ("import logging, libreyolo.cli as c; c.main(['version']); "
            "logging.getLogger('libreyolo.data.video').warning('video %s ended', 'a.mp4'); "
            "logging.getLogger('libreyolo.engine.trainer').info('libreyolo: epoch 1/1'); "
            "logging.getLogger('other').warning('theirs')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE.parent),
                                                                  os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["libreyolo: video a.mp4 ended", "libreyolo: epoch 1/1", "theirs"]


def test_a_module_record_reaches_a_handler_of_the_package_logger():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)
    lib, handler = logging.getLogger("libreyolo"), Keep()
    lib.addHandler(handler)
    try:
        from libreyolo.data import video
        video.log.warning("probe %d", 1)
    finally:
        lib.removeHandler(handler)
    assert [(r.name, r.getMessage()) for r in records] == [("libreyolo.data.video", "probe 1")]
