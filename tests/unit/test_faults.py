"""Fault injection in training (CPU): kill -9 inside a checkpoint write and inside validation,
then resume; a DataLoader worker killed mid-epoch; a full disk while writing results.csv and
results.png. What is already saved survives; the run either goes on or stops with one clear
message; resume=True finishes the run."""
import csv
import errno
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine import loaders as LD
from libreyolo.engine import loggers as LG
from libreyolo.engine import runs as R
from libreyolo.engine import trainer as T
from libreyolo.weights import load_checkpoint

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fault_child  # noqa: E402
from fault_child import run_args  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("faults") / "ds", n_train=8, n_val=4, imgsz=64, seed=0))


def _child(mode: str, data: str, project: str) -> None:
    torch.set_num_threads(1)   # a forked process: one thread (the parent's pool is not ours)
    fault_child.main(mode, data, project)


@pytest.fixture(scope="module")
def killed(data, tmp_path_factory):
    """Both self-killing runs, forked from this process (torch already imported) and run together."""
    ctx = multiprocessing.get_context("fork")
    procs = {}
    for mode in ("ckpt", "val"):
        project = tmp_path_factory.mktemp(f"killed-{mode}")
        procs[mode] = (ctx.Process(target=_child, args=(mode, data, str(project)), daemon=True), project)
        procs[mode][0].start()
    yield procs
    for p, _ in procs.values():
        if p.is_alive():
            p.kill()
        p.join()


def wait_killed(proc) -> None:
    proc.join(timeout=180)
    assert proc.exitcode == -signal.SIGKILL, f"exit code {proc.exitcode}: the kill did not happen"


def csv_epochs(run: Path) -> list[int]:
    with (run / "results.csv").open(newline="") as f:
        return [int(r["epoch"]) for r in csv.DictReader(f)]


def resume(data: str, project: Path, **kw) -> dict:
    model = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0)
    return model.train(**{**run_args(data, str(project)), "resume": True, **kw})


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_kill_9_inside_the_last_pt_write_then_resume(killed, data):
    proc, project = killed["ckpt"]
    wait_killed(proc)
    run, weights = project / "run", project / "run" / "weights"
    # the dead save left its half-written temp file; last.pt is epoch 1's, whole
    assert [t for t in temps(weights) if t.startswith(".last.pt.")], list(weights.iterdir())
    assert load_checkpoint(weights / "last.pt")["train_state"]["epoch"] == 0
    assert csv_epochs(run) == [1, 2]          # epoch 2's row was written before its checkpoint
    # the dead writer's temp is older than the grace a just-created temp gets before its lock
    # (weights.STALE_TEMP_GRACE_S), however quickly the resumed epoch reaches its save
    old = time.time() - 60
    for t in temps(weights):
        os.utime(weights / t, (old, old))
    res = resume(data, project)
    assert res["epochs"] == 1                 # epoch 2 again, once
    assert load_checkpoint(weights / "last.pt")["train_state"]["epoch"] == 1
    assert LibreYOLO(str(weights / "best.pt"), device="cpu").trained
    assert temps(weights) == []               # the next save removed the dead writer's temp file
    assert csv_epochs(run) == [1, 2]          # not [1, 2, 2]


def test_kill_9_during_validation_then_resume(killed, data):
    proc, project = killed["val"]
    wait_killed(proc)
    run, weights = project / "run", project / "run" / "weights"
    assert load_checkpoint(weights / "last.pt")["train_state"]["epoch"] == 0
    assert csv_epochs(run) == [1] and temps(weights) == []
    res = resume(data, project)
    assert res["epochs"] == 1 and load_checkpoint(weights / "last.pt")["train_state"]["epoch"] == 1
    assert csv_epochs(run) == [1, 2] and temps(weights) == []


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")   # no torch traceback printed
def test_dataloader_worker_killed_mid_epoch_stops_with_one_clear_message(data, tmp_path, monkeypatch):
    real_step, steps = T.Trainer.step, []

    def step(self, ni, batch):
        steps.append(ni)
        if ni == self.nb + 1:                 # epoch 2, second batch: kill the worker feeding it
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGKILL)
        return real_step(self, ni, batch)

    monkeypatch.setattr(T.Trainer, "step", step)
    with pytest.raises(R.TrainingError) as info:
        resume(data, tmp_path, resume=False, workers=1)
    msg = str(info.value)
    assert "epoch 2/2" in msg and "DataLoader worker" in msg and "resume=True" in msg, msg
    assert str(tmp_path / "run" / "weights" / "last.pt") in msg and "holds epoch 1" in msg, msg
    assert info.value.__cause__ is None and info.value.__context__ is None   # no torch traceback under it
    assert load_checkpoint(tmp_path / "run" / "weights" / "last.pt")["train_state"]["epoch"] == 0
    # torch's SIGCHLD check no longer knows the dead worker: another child's exit raises nothing
    subprocess.run(["true"], check=True)
    time.sleep(0.05)
    assert not isinstance(signal.getsignal(signal.SIGCHLD), LD.WorkerDeathSignal)   # torch's handler back
    monkeypatch.setattr(T.Trainer, "step", real_step)
    res = resume(data, tmp_path, workers=1)   # workers again: no stale worker registration
    assert res["epochs"] == 1 and csv_epochs(tmp_path / "run") == [1, 2]


def test_worker_death_signal_reports_the_first_death_only_then_puts_the_handler_back():
    """After a worker died, torch's SIGCHLD check raises its error at every child exit, wherever the
    main thread is (in the except clause handling the first, inside a loader's shutdown). The run's
    wrapper lets the first through and drops the rest until the run ends."""
    calls = []

    def torch_like(signum, frame):
        calls.append(signum)
        raise RuntimeError("DataLoader worker (pid 12345) is killed by signal: Killed.")

    previous = signal.signal(signal.SIGCHLD, torch_like)
    try:
        w = LD.WorkerDeathSignal()
        w.install()
        assert signal.getsignal(signal.SIGCHLD) is w and w.inner is torch_like
        w.install()   # a later epoch's iterator: not wrapped twice
        assert w.inner is torch_like
        with pytest.raises(RuntimeError, match="DataLoader worker"):
            w(signal.SIGCHLD, None)
        w(signal.SIGCHLD, None)   # the second report: dropped
        assert calls == [signal.SIGCHLD] and w.quiet
        w.uninstall()
        assert signal.getsignal(signal.SIGCHLD) is torch_like and not w.quiet
    finally:
        signal.signal(signal.SIGCHLD, previous if previous is not None else signal.SIG_DFL)

    def dataset_error(signum, frame):   # not a worker's death: every one raised
        raise RuntimeError("something else")

    w = LD.WorkerDeathSignal()
    w.inner = dataset_error
    for _ in range(2):
        with pytest.raises(RuntimeError, match="something else"):
            w(signal.SIGCHLD, None)
    assert not w.quiet


class FullDisk:
    """``open`` that, for the ``fail`` write-opens (counted from 1) of files whose name contains
    ``marker``, stores half of what is written and then fails with ENOSPC, as a full disk does."""

    def __init__(self, marker: str, fail: set[int]):
        self.marker, self.fail, self.opens = marker, fail, 0
        self.real = open

    def __call__(self, file, mode="r", *args, **kwargs):
        f = self.real(file, mode, *args, **kwargs)
        if self.marker not in os.path.basename(str(file)) or not any(c in mode for c in "wax"):
            return f
        self.opens += 1
        if self.opens in self.fail:
            real_write = f.write

            def write(text):
                real_write(text[: len(text) // 2])
                f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))

            f.write = write
        return f


def test_full_disk_while_writing_results_csv(data, tmp_path, monkeypatch, caplog):
    """Epoch 2's results.csv write hits a full disk: one warning, training goes on (epoch 3, its
    checkpoints), the file keeps epoch 1's whole row meanwhile (never half a line), and epoch 3
    writes the missing row with its own."""
    monkeypatch.setattr(LG, "open", FullDisk("results.csv", fail={2}), raising=False)
    real_end, seen = LG.LoggingHook.after_epoch, []

    def after_epoch(self):
        real_end(self)
        seen.append(csv_epochs(self.trainer.run_dir))

    monkeypatch.setattr(LG.LoggingHook, "after_epoch", after_epoch)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        res = resume(data, tmp_path, resume=False, epochs=3)
    assert seen == [[1], [1], [1, 2, 3]]
    warned = [m for m in caplog.messages if "results.csv" in m]
    assert len(warned) == 1 and "training goes on" in warned[0] and "No space" in warned[0], caplog.messages
    assert res["epochs"] == 3 and load_checkpoint(res["last"])["train_state"]["epoch"] == 2
    assert not [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]


def test_full_disk_while_drawing_results_png(data, tmp_path, monkeypatch, caplog):
    """results.png fails to save at its first drawing (half a file written, then ENOSPC): one
    warning, no temp picture left, training goes on and the end of the run draws it again."""
    from matplotlib.figure import Figure
    real_savefig, calls = Figure.savefig, []

    def savefig(self, fname, *args, **kwargs):
        calls.append(str(fname))
        if len(calls) == 1:
            Path(fname).write_bytes(b"\x89PNG half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(fname))
        return real_savefig(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    monkeypatch.setattr(LG.LoggingHook, "plot_in_child", False)   # drawn here, where savefig is patched
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        res = resume(data, tmp_path, resume=False, plots=True)
    warned = [m for m in caplog.messages if "results.png" in m]
    assert len(warned) == 1 and "training goes on" in warned[0], caplog.messages
    run = tmp_path / "run"
    assert res["epochs"] == 2 and (run / "results.png").stat().st_size > 1000
    assert not list(run.glob("*.tmp*")) and csv_epochs(run) == [1, 2]
    assert load_checkpoint(res["last"])["train_state"]["epoch"] == 1


def test_a_worker_death_inside_a_grad_mode_switch_leaves_the_callers_grad_mode(data, tmp_path, monkeypatch):
    """torch's SIGCHLD handler raises the worker's death wherever the main thread is, also between
    an optimizer step's set_grad_enabled(False) and its restore: the run stops with its
    TrainingError and the caller's grad mode is back (else every later training in the process
    computes losses without a graph)."""
    real_step = T.Trainer.step

    def step(self, ni, batch):
        if ni == self.nb + 1:
            torch.set_grad_enabled(False)   # as inside torch.optim's step when the signal lands
            raise RuntimeError("DataLoader worker (pid 12345) is killed by signal: Killed.")
        return real_step(self, ni, batch)

    monkeypatch.setattr(T.Trainer, "step", step)
    assert torch.is_grad_enabled()
    with pytest.raises(R.TrainingError, match="DataLoader worker"):
        resume(data, tmp_path, resume=False, workers=0)
    assert torch.is_grad_enabled()
    monkeypatch.setattr(T.Trainer, "step", real_step)
    assert resume(data, tmp_path)["epochs"] == 1
