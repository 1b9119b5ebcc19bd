"""Checkpoints written by a child interpreter (engine/ckptwriter.py): the snapshot crosses the pipe
bit for bit, the child writes what the training process would have written, its errors come back
as the write's own exception, a dead child leaves the writing to the caller, and a training run
that writes through it ends with every file on disk and the child gone."""
import io
import logging

import pytest
import torch
from tuning import tune_defaults  # tests/tuning.py

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine import ckptwriter as C
from libreyolo.engine import loggers as LG
from libreyolo.weights import PackedSnapshot, load_checkpoint


def checkpoint() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"model": {"w": torch.randn(3, 4, generator=g), "n": torch.tensor(7),
                      "h": torch.randn(5, generator=g).to(torch.bfloat16)},
            "train_state": {"optimizer": {"state": {0: {"momentum_buffer": torch.randn(
                2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last)}},
                "param_groups": [{"lr": 0.1, "params": [0]}]}, "epoch": 3},
            "names": {0: "a"}, "nan": torch.tensor([float("nan"), -0.0])}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
                and torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def test_a_snapshot_crosses_the_pipe_bit_for_bit_with_its_buffers_out_of_band():
    snap = PackedSnapshot(checkpoint(), contiguous=("model",))
    stream = io.BytesIO()
    C.send(stream, ("write", ["last.pt"], snap))
    C.send(stream, ("quit",))
    size = stream.tell()
    stream.seek(0)
    msg = C.receive(stream)
    assert msg[:2] == ("write", ["last.pt"]) and same(msg[2].unpack(), snap.unpack())
    assert C.receive(stream) == ("quit",) and C.receive(stream) is None   # the stream's end between objects
    stream.truncate(size - 3)
    stream.seek(0)
    C.receive(stream)
    with pytest.raises(EOFError):   # cut inside an object
        C.receive(stream)


@pytest.fixture
def writer():
    w = C.WriterProcess()
    yield w
    w.close()


def test_the_child_writes_last_and_best_as_the_training_process_does(writer, tmp_path):
    snap = PackedSnapshot(checkpoint(), contiguous=("model",))
    written = []
    assert writer.write(snap, [tmp_path / "last.pt", tmp_path / "best.pt"], written)
    assert written == [tmp_path / "last.pt", tmp_path / "best.pt"]
    C.write_snapshot(snap, [tmp_path / "here" / "last.pt", tmp_path / "here" / "best.pt"])
    for name in ("last.pt", "best.pt"):
        assert same(load_checkpoint(tmp_path / name), load_checkpoint(tmp_path / "here" / name))
    assert "train_state" not in load_checkpoint(tmp_path / "best.pt")
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_childs_error_is_raised_as_the_writes_own_and_names_what_was_written(writer, tmp_path):
    snap = PackedSnapshot(checkpoint())
    (tmp_path / "file").write_text("not a folder")
    written = []
    with pytest.raises(OSError) as info:   # best.pt's folder is a file
        writer.write(snap, [tmp_path / "last.pt", tmp_path / "file" / "best.pt"], written)
    assert "file" in str(info.value) and written == [tmp_path / "last.pt"]
    assert writer.write(snap, [tmp_path / "again.pt"])   # the child goes on


def test_a_dead_child_leaves_the_writing_to_the_caller(writer, tmp_path, caplog):
    writer.proc.kill()
    writer.proc.wait()
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        assert writer.write(PackedSnapshot(checkpoint()), [tmp_path / "last.pt"]) is False
    assert "writer process is gone" in caplog.text and writer.proc is None
    assert not (tmp_path / "last.pt").exists()
    assert writer.write(PackedSnapshot(checkpoint()), [tmp_path / "last.pt"]) is False   # and stays gone
    writer.close()


def test_a_training_run_writes_through_the_child_and_ends_it(tmp_path, monkeypatch):
    data = make_shapes_dataset(tmp_path / "ds", n_train=8, n_val=4, imgsz=64, seed=0)
    tune_defaults(monkeypatch, checkpoint_process=True)
    real, calls, procs = C.WriterProcess.write, [], []

    def write(self, snapshot, paths, written=None):
        procs.append(self.proc)
        calls.append(real(self, snapshot, paths, written))
        return calls[-1]
    monkeypatch.setattr(C.WriterProcess, "write", write)
    res = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0).train(
        data=str(data), epochs=2, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="run",
        warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, seed=0)
    assert calls == [True, True]   # both epochs' files written by the child
    for p in procs:   # told to quit at the run's end
        p.wait(timeout=30)
    last = load_checkpoint(tmp_path / "run" / "weights" / "last.pt")
    assert last["train_state"]["epoch"] == 1 and LibreYOLO(res["best"], device="cpu").trained


def test_the_child_ends_also_when_a_hook_before_the_checkpoints_fails_at_the_end(tmp_path, monkeypatch):
    data = make_shapes_dataset(tmp_path / "ds", n_train=4, n_val=4, imgsz=64, seed=0)
    tune_defaults(monkeypatch, checkpoint_process=True)
    started = []
    real_init = C.WriterProcess.__init__

    def init(self):
        real_init(self)
        started.append(self.proc)
    monkeypatch.setattr(C.WriterProcess, "__init__", init)

    def fail(self):
        raise RuntimeError("the logging hook's end failed")
    monkeypatch.setattr(LG.LoggingHook, "after_train", fail)
    with pytest.raises(RuntimeError, match="logging hook"):
        LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0).train(
            data=str(data), epochs=1, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="run",
            warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, seed=0)
    assert len(started) == 1 and started[0] is not None
    started[0].wait(timeout=30)   # told to quit all the same
    assert load_checkpoint(tmp_path / "run" / "weights" / "last.pt")["train_state"]["epoch"] == 0
