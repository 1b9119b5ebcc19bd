"""results.png's drawing child (engine.plots.PlotProcess): it draws what plot_results draws,
reports an error the parent raises, imports no torch, and a dead child falls back to drawing here."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from libreyolo.engine import plots
from libreyolo.engine.plots import PlotProcess


def _csv(path: Path, n: int = 3) -> Path:
    cols = ["epoch", "train/box_loss", "metrics/mAP50-95", "time/epoch_s", "time/val_s"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for e in range(1, n + 1):
            w.writerow([e, 3.0 / e, 0.1 * e, 1.0, "nan" if e == 1 else 0.2])
    return path


def test_the_child_draws_results_png_and_reports_an_error_the_parent_raises(tmp_path):
    src = _csv(tmp_path / "results.csv")
    child = PlotProcess()
    try:
        out = child.draw(src)
        assert out == tmp_path / "results.png" and out.stat().st_size > 1000
        assert child._proc is not None and child._proc.poll() is None   # it serves the next one too
        with pytest.raises(RuntimeError, match="FileNotFoundError"):
            child.draw(src, tmp_path / "no-such-folder" / "r.png")
        again = child.draw(src, tmp_path / "again.png")   # alive after an error
        assert again.stat().st_size > 1000 and child.failed is None
        assert not list(tmp_path.rglob("*.tmp*"))
    finally:
        child.close()
    assert child._proc is None


def test_the_child_imports_matplotlib_alone_not_torch(tmp_path):
    """The child runs engine/plots.py by itself: neither torch nor the package is imported."""
    from libreyolo import childproc
    code = childproc._SNIPPET.replace("m.serve()", "import json; print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, plots.__file__, "plots_child"], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    mods = set(json.loads(out))
    assert "torch" not in mods and "libreyolo" not in mods and "numpy" not in mods


def test_a_dead_child_falls_back_to_drawing_in_this_process(tmp_path):
    src = _csv(tmp_path / "results.csv")
    child = PlotProcess()
    child.draw(src)
    child._proc.kill()
    child._proc.wait()
    out = child.draw(src, tmp_path / "here.png")   # the reply never comes: drawn here instead
    assert out.stat().st_size > 1000 and child.failed is not None and child._proc is None
    assert child.draw(src, tmp_path / "here2.png").stat().st_size > 1000   # no new child either
    assert child._proc is None


def test_a_child_that_cannot_start_draws_here(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise OSError("no processes left")
    monkeypatch.setattr(subprocess, "Popen", refuse)
    child = PlotProcess()
    out = child.draw(_csv(tmp_path / "results.csv"))
    assert out.stat().st_size > 1000 and "no processes left" in child.failed


def test_the_child_ends_while_a_forked_process_holds_its_pipe(tmp_path):
    """The quit line ends the child though a process forked after it (a loader worker) holds its
    stdin's write end (exit status 0, not the kill after the wait's timeout)."""
    import multiprocessing as mp
    import time
    child = PlotProcess()
    child.draw(_csv(tmp_path / "results.csv"))
    holder = mp.get_context("fork").Process(target=time.sleep, args=(60,))
    holder.start()
    proc = child._proc
    try:
        child.close()
        assert proc.returncode == 0
    finally:
        holder.kill()
        holder.join()


@pytest.mark.parametrize("n,ticks", [(1, [1]), (3, [1, 2, 3])])
def test_results_png_marks_whole_epochs(tmp_path, monkeypatch, n, ticks):
    """A short run's panels mark its epochs (one epoch drew 0.96 ... 1.04 before)."""
    from matplotlib.figure import Figure
    seen = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (seen.append(self), real(self, *a, **k))[1])
    plots.plot_results(_csv(tmp_path / "results.csv", n))
    axes = [ax for ax in seen[0].axes if ax.axison]
    assert axes and all(list(ax.get_xticks()) == ticks for ax in axes)
