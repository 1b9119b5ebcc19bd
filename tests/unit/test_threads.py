"""torch's intra-op thread count on the CPU: chosen from the cores the process can get, said in
one log line, settable (threads=, LIBREYOLO_THREADS), and never changed where the user chose it."""
from __future__ import annotations

import logging

import pytest
import torch

from libreyolo import threads
from libreyolo.options import OptionError


@pytest.fixture
def fresh(monkeypatch):
    """No OMP_NUM_THREADS nor LIBREYOLO_THREADS, torch's count as at import, the module's state
    reset; torch's count restored afterwards."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setattr(threads, "_INITIAL", 4)
    monkeypatch.setattr(threads, "_state", {"set": None, "auto": None, "logged": None})
    yield
    torch.set_num_threads(before)


def test_choice_from_cores_quota_and_load(fresh):
    n, why = threads.choose_threads(cores=8, quota=None, load=0.2, machine_cores=8, current=4)
    assert n == 4 and "torch's default 4" in why   # never above torch's own count
    assert threads.choose_threads(cores=2, quota=None, load=0.1, machine_cores=8, current=4)[0] == 2   # affinity
    n, why = threads.choose_threads(cores=8, quota=1.5, load=0.0, machine_cores=8, current=4)
    assert n == 1 and "cgroup quota 1.5" in why
    n, why = threads.choose_threads(cores=2, quota=None, load=4.0, machine_cores=2, current=4)
    assert n == 1 and "load 4.0 on 2 core(s)" in why   # a busy machine: one thread
    assert threads.choose_threads(cores=4, quota=None, load=1.2, machine_cores=4, current=4)[0] == 3


def test_option_and_environment(fresh, monkeypatch):
    assert threads.choose_threads(3, cores=1, load=9.0, machine_cores=1, current=4) == (3, "threads=3 given")
    monkeypatch.setenv(threads.ENV, "2")
    assert threads.choose_threads(cores=1, load=9.0, machine_cores=1, current=4) == (2, f"{threads.ENV}=2")
    monkeypatch.setenv(threads.ENV, "many")
    with pytest.raises(OptionError, match="LIBREYOLO_THREADS must be an integer >= 1, got 'many'"):
        threads.choose_threads()
    with pytest.raises(OptionError, match="threads must be an integer >= 1, got 0"):
        threads.choose_threads(0)


def test_user_choice_left_alone(fresh, monkeypatch):
    n, why = threads.choose_threads(cores=1, load=9.0, machine_cores=1, current=3)   # torch.set_num_threads(3)
    assert n is None and "torch.set_num_threads(3) was called" in why
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    n, why = threads.choose_threads(cores=1, load=9.0, machine_cores=1, current=4)
    assert n is None and why == "OMP_NUM_THREADS=2 is set"


def test_apply_sets_and_logs_once(fresh, monkeypatch, caplog):
    monkeypatch.setattr(threads, "_INITIAL", torch.get_num_threads())
    monkeypatch.setattr(threads, "_load", lambda: 99.0)   # a machine others keep busy
    caplog.set_level(logging.INFO, logger="libreyolo.threads")
    assert threads.apply_threads(None, "cpu") == 1
    assert threads.apply_threads(None, "cpu") == 1   # the choice is made once, said once
    lines = [r.getMessage() for r in caplog.records if r.name == "libreyolo.threads"]
    assert len(lines) == 1 and lines[0].startswith("CPU threads: 1, from torch's default") and "load 99.0" in lines[0]
    torch.set_num_threads(2)   # the user's own choice after the run's: left alone
    assert threads.apply_threads(None, "cpu") == 2
    assert "torch.set_num_threads(2) was called" in caplog.records[-1].getMessage()


def test_apply_leaves_cuda_runs_alone(fresh):
    before = torch.get_num_threads()
    assert threads.apply_threads(1, "cuda:0") == before


def test_cgroup_quota(tmp_path):
    assert threads.cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_cpus(tmp_path) == 1.5
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cpus(tmp_path) == 2.0


def test_threads_option_of_predict_val_train(fresh, caplog):
    from libreyolo import LibreYOLO
    from libreyolo.engine.config import TrainConfig
    caplog.set_level(logging.INFO, logger="libreyolo.threads")
    model = LibreYOLO("yoloxn", device="cpu")
    model.predict(torch.zeros(32, 32, 3, dtype=torch.uint8).numpy(), imgsz=64, threads=1)
    assert torch.get_num_threads() == 1
    assert any(r.getMessage() == "CPU threads: 1, threads=1 given" for r in caplog.records)
    with pytest.raises(OptionError, match="threads must be an integer >= 1"):
        model.predict(torch.zeros(32, 32, 3, dtype=torch.uint8).numpy(), imgsz=64, threads=0)
    assert TrainConfig("detect", threads=2).tune.threads == 2
    with pytest.raises(OptionError, match="threads"):
        TrainConfig("detect", threads="x")
