"""Child interpreters that run one of the package's files alone (its ``serve()`` loop on stdin and
stdout), without importing the package or torch: results.png's drawing
(:class:`~libreyolo.engine.plots.PlotProcess`) and the detection evaluation's pool
(:class:`~libreyolo.tasks.detect.evalpool.EvalPool`)."""
from __future__ import annotations

import subprocess
import sys

# the caller's folder and the script's are taken off sys.path so that no file there shadows a
# module the child imports
_SNIPPET = ("import sys; del sys.path[0]; import importlib.util as u; "
            "s = u.spec_from_file_location(sys.argv[2], sys.argv[1]); m = u.module_from_spec(s); "
            "sys.modules[sys.argv[2]] = m; s.loader.exec_module(m); m.serve()")


class ChildGone(RuntimeError):
    """A child exited with a request in flight (its caller does the work in its own process)."""


def start_child(file: str, name: str, text: bool = False) -> subprocess.Popen:
    """``file``'s ``serve()`` in a new interpreter (the module named ``name`` there), its stdin and
    stdout piped (text lines, or bytes), its stderr dropped; OSError when it cannot start."""
    return subprocess.Popen([sys.executable, "-c", _SNIPPET, str(file), name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=text,
                            bufsize=1 if text else -1)


def end_children(procs: list, quit: bytes | str, timeout: float = 10.0) -> None:
    """Send each child its ``quit`` message (its ``serve()`` returns) and close its stdin, then wait
    for it; one still running after ``timeout`` seconds is killed. The message, not the pipe's end,
    ends a child: a process forked from ours after the child started (a DataLoader worker) holds
    a copy of the pipe's write end, and the child would not see the end before that one exits."""
    for proc in procs:
        try:
            proc.stdin.write(quit)
            proc.stdin.flush()
        except (OSError, ValueError):
            pass
        try:
            proc.stdin.close()
        except OSError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
