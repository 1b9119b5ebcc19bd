"""What a `libreyolo` process costs outside the trainer: the prompt exit of the CLI (exit handlers
run, output flushed, no interpreter teardown)."""
import subprocess
import sys
import threading

import pytest

from libreyolo import cli


class Exited(Exception):
    pass


@pytest.mark.parametrize("rc,code", [(0, 0), (2, 2), (None, 0)])
def test_entry_runs_the_exit_handlers_then_exits_with_mains_code(monkeypatch, rc, code):
    calls = []
    monkeypatch.setattr(cli, "main", lambda: calls.append("main") or rc)
    monkeypatch.setattr("atexit._run_exitfuncs", lambda: calls.append("atexit"))
    # in this process, the thread pools' exit hook would end every later test's pools, and other
    # tests' threads are not entry()'s to wait for
    monkeypatch.setattr("concurrent.futures.thread._python_exit", lambda: calls.append("pools"))
    monkeypatch.setattr("threading.enumerate", lambda: [threading.main_thread()])

    def _exit(value):
        calls.append(("exit", value))
        raise Exited

    monkeypatch.setattr("os._exit", _exit)
    with pytest.raises(Exited):
        cli.entry()
    assert calls == ["main", "pools", "atexit", ("exit", code)]


def test_the_program_flushes_its_output_before_the_prompt_exit():
    out = subprocess.run([sys.executable, "-m", "libreyolo.cli", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("libreyolo "), (out.stdout, out.stderr)



def test_the_program_exits_with_an_idle_thread_pool_alive():
    """An executor a library left idle (OpenVINO's telemetry sender is one) does not keep the
    program from exiting: its workers are woken as the interpreter's own exit would."""
    code = ("import concurrent.futures as f, sys\n"
            "pool = f.ThreadPoolExecutor()\n"
            "pool.submit(lambda: 1).result()\n"
            "from libreyolo import cli\n"
            "sys.argv = ['libreyolo', '--version']\n"
            "cli.entry()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("libreyolo "), (out.stdout, out.stderr)
