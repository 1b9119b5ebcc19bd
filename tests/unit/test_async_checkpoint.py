"""Checkpoints written in the background (engine/background.py, weights.host_snapshot, the
trainer's CheckpointHook): the same content as a synchronous save, a snapshot that training can no
longer change, one write at a time, joined at the end, and a failed write raised as a clear error
at the next save or at the end of the run."""
import collections
import errno
import os
import threading

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo import weights as W
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine import hooks as H
from libreyolo.engine import optim as O
from libreyolo.engine import trainer as T
from libreyolo.engine.background import BackgroundJob
from libreyolo.weights import host_snapshot, load_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("asyncck") / "ds", n_train=8, n_val=4, imgsz=64, seed=0))


def run(data, tmp_path, **kw):
    args = dict(data=data, epochs=2, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="run",
                warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, seed=0)
    return LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0).train(**{**args, **kw})


def equal(a, b) -> bool:
    """Checkpoint contents equal: tensors by value (and dtype, shape), everything else by ==."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def test_snapshot_is_a_copy_that_saves_what_the_original_would(tmp_path):
    w = torch.arange(12.0).reshape(3, 4)
    nhwc = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    ck = {"model": {"w": w, "nhwc": nhwc}, "train_state": {"optimizer": {"state": {0: {"momentum_buffer": w * 2}},
                                                                         "param_groups": [{"lr": 0.1, "params": [0]}]},
                                                     "epoch": 3}, "names": {0: "a"}}
    snap = host_snapshot(ck)
    save_checkpoint(ck, tmp_path / "sync.pt")
    save_checkpoint(snap, tmp_path / "snap.pt")
    assert equal(torch.load(tmp_path / "sync.pt"), torch.load(tmp_path / "snap.pt"))
    assert snap["model"]["nhwc"].stride() == nhwc.stride()              # strides kept
    w.add_(100.0)                                                       # training goes on in place
    ck["train_state"]["optimizer"]["param_groups"][0]["lr"] = 0.5
    assert snap["model"]["w"][0, 1] == 1.0 and snap["train_state"]["optimizer"]["param_groups"][0]["lr"] == 0.1


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (NaN payloads and signed zeros included), in logical order."""
    return t.contiguous().reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.contiguous()


@pytest.mark.parametrize("chunk", [None, 64])   # 64 bytes: several buffers per dtype
def test_host_copies_are_the_same_bytes_in_their_own_memory(monkeypatch, chunk):
    if chunk is not None:
        monkeypatch.setattr(W, "HOST_COPY_CHUNK_BYTES", chunk)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(40, generator=g)
    base[3], base[7] = float("nan"), -0.0
    big = torch.randn(6, 5, 4, generator=g)
    sources = [
        base[2:14].reshape(3, 4),                                          # a view at an offset
        torch.randn(2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last),
        torch.randn(1, 2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last_3d),
        torch.tensor(2.5), torch.tensor(7, dtype=torch.int64),             # 0-d
        torch.empty(0, 3), torch.randint(0, 9, (5,), generator=g).to(torch.int32),
        big.transpose(0, 2), big[:, ::2], torch.ones(3).expand(4, 3),      # not dense
        torch.randn(9, generator=g).to(torch.bfloat16), torch.tensor([True, False, True]),
        torch.nn.Parameter(torch.randn(4, 4, generator=g)), torch.tensor([5.0]),
        torch.eye(3).to_sparse(),                                          # not strided: copied alone
    ]
    copies = W.host_copies(sources)
    assert len(copies) == len(sources)
    for src, got in zip(sources, copies):
        assert got.device.type == "cpu" and got.dtype == src.dtype and got.shape == src.shape
        assert not got.requires_grad
        if src.layout == torch.strided:
            assert got.is_contiguous() and torch.equal(_bits(got), _bits(src.detach()))
        else:
            assert torch.equal(got.to_dense(), src.to_dense())
    # each copy has its own memory: no two share a storage, none shares the source's
    strided = [(s, c) for s, c in zip(sources, copies) if c.layout == torch.strided and c.numel()]
    ptrs = [c.untyped_storage().data_ptr() for _, c in strided]
    assert len(set(ptrs)) == len(ptrs)
    assert all(c.untyped_storage().nbytes() == c.numel() * c.element_size() for _, c in strided)
    assert not {s.untyped_storage().data_ptr() for s, _ in strided} & set(ptrs)
    before = copies[0].clone()
    base.add_(1.0)
    assert torch.equal(_bits(copies[0]), _bits(before))


def test_packed_snapshot_is_taken_at_the_call_and_unpacked_later():
    """What the trainer's writer thread saves is the checkpoint as it was when the snapshot was
    taken, whatever training did to its tensors and containers since."""
    w, m = torch.arange(6.0), torch.ones(2, 2)
    ck = {"model": {"w": w}, "train_state": {"optimizer": {"state": {0: {"momentum_buffer": m}}}, "epoch": 1},
          "names": ["a"]}
    snap = W.PackedSnapshot(ck)
    w.mul_(0.0)
    m.add_(5.0)
    ck["names"].append("b")
    ck["train_state"]["epoch"] = 2
    out = snap.unpack()
    assert torch.equal(out["model"]["w"], torch.arange(6.0))
    assert torch.equal(out["train_state"]["optimizer"]["state"][0]["momentum_buffer"], torch.ones(2, 2))
    assert out["train_state"]["epoch"] == 1 and out["names"] == ["a"]


Pair = collections.namedtuple("Pair", "a b")   # at module level: the snapshot is pickled


def test_packed_snapshot_rebuilds_every_container_of_its_kind_and_refuses_unknown_ones():
    import collections
    import pickle
    t = torch.arange(4.0)
    sd = collections.OrderedDict(w=t, b=t + 1)
    ck = {"model": sd, "groups": [{"betas": (0.9, 0.99), "params": [0, 1]}], "pair": Pair(t * 2, "x"),
          "flags": {"a"}, "none": None, "shared": t}
    snap = W.PackedSnapshot(ck, contiguous=("model",))
    out = pickle.loads(pickle.dumps(snap, protocol=5)).unpack()   # as the writer's child gets it
    assert type(out["model"]) is collections.OrderedDict and list(out["model"]) == ["w", "b"]
    assert out["model"] is not sd and out["groups"][0] is not ck["groups"][0]
    assert out["groups"] == [{"betas": (0.9, 0.99), "params": [0, 1]}] and type(out["groups"][0]["betas"]) is tuple
    assert type(out["pair"]) is Pair and out["pair"].b == "x" and torch.equal(out["pair"].a, t * 2)
    assert out["flags"] == {"a"} and out["none"] is None
    # the same tensor at two places: two copies, each with the value, neither the training's
    assert torch.equal(out["shared"], t) and torch.equal(out["model"]["w"], t)
    assert out["shared"].data_ptr() != t.data_ptr() != out["model"]["w"].data_ptr()
    with pytest.raises(TypeError, match="defaultdict.*train_state.stats"):
        W.PackedSnapshot({"train_state": {"stats": collections.defaultdict(list)}})


def test_packed_snapshot_keeps_dense_layouts_except_under_its_contiguous_keys():
    g = torch.Generator().manual_seed(1)
    nhwc = torch.randn(4, 3, 3, 3, generator=g).contiguous(memory_format=torch.channels_last)
    dense_t = torch.randn(5, 7, generator=g).t()                         # a permutation: dense
    sparse_rows = torch.randn(6, 4, generator=g)[::2]                    # gaps: not dense
    ck = {"model": {"w": nhwc}, "train_state": {"model_raw": {"w": nhwc}, "optimizer": {"state": {0: {
        "momentum_buffer": nhwc * 2, "t": dense_t, "rows": sparse_rows}}}}}
    out = W.PackedSnapshot(ck, contiguous=("model", "train_state.model_raw")).unpack()
    assert out["model"]["w"].is_contiguous() and out["train_state"]["model_raw"]["w"].is_contiguous()
    state = out["train_state"]["optimizer"]["state"][0]
    assert state["momentum_buffer"].stride() == nhwc.stride() and state["t"].stride() == dense_t.stride()
    assert state["rows"].is_contiguous()
    for got, want in ((out["model"]["w"], nhwc), (state["momentum_buffer"], nhwc * 2), (state["t"], dense_t),
                      (state["rows"], sparse_rows)):
        assert torch.equal(got, want)


def test_resumable_checkpoint_of_a_channels_last_run_keeps_the_optimizers_layout(data, tmp_path):
    """last.pt of a channels_last run: the weights contiguous (the LibreYOLO layout), each momentum
    buffer in its parameter's layout (a fused optimizer refuses mismatched layouts on resume)."""
    run(data, tmp_path, epochs=1, channels_last=True)
    ck = load_checkpoint(tmp_path / "run" / "weights" / "last.pt")
    assert all(v.is_contiguous() for v in ck["model"].values())
    assert all(v.is_contiguous() for v in ck["train_state"]["model_raw"].values())
    buffers = [s["momentum_buffer"] for s in ck["train_state"]["optimizer"]["state"].values()]
    assert any(b.dim() == 4 and not b.is_contiguous() and b.is_contiguous(memory_format=torch.channels_last)
               for b in buffers)
    assert all(b.dim() != 4 or b.is_contiguous(memory_format=torch.channels_last) for b in buffers)


def test_checkpoint_of_is_contiguous_host_tensors_of_the_state_dict():
    model = LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0)
    model.model.to(memory_format=torch.channels_last)
    sd = model.model.state_dict()
    ck = model.checkpoint_of(model.model)["model"]
    assert list(ck) == list(sd)
    assert all(v.is_contiguous() and v.device.type == "cpu" and torch.equal(v, sd[k]) for k, v in ck.items())
    assert any(not v.is_contiguous() for v in sd.values())   # the channels_last sources were covered


def test_background_job_one_at_a_time_and_errors_surface_once():
    job, order, gate = BackgroundJob("test writer"), [], threading.Event()

    def first():
        gate.wait(5)
        order.append("first")

    job.submit(first, what="first")
    assert job.busy()
    threading.Timer(0.05, gate.set).start()
    job.submit(lambda: order.append("second"), what="second")   # waits for the first
    job.wait()
    assert order == ["first", "second"] and not job.busy()

    def fails():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "last.pt")

    job.submit(fails, what="epoch 3's checkpoints")
    with pytest.raises(OSError) as info:
        job.submit(lambda: order.append("never"))   # the next submit raises the previous job's error
    assert "epoch 3's checkpoints" in "".join(info.value.__notes__) and "test writer" in "".join(info.value.__notes__)
    job.wait()   # raised once
    assert order == ["first", "second"]
    job.submit(fails)
    assert isinstance(job.close(raising=False), OSError) and job.close() is None


def test_training_checkpoints_equal_a_synchronous_save_and_the_writer_is_joined(data, tmp_path, monkeypatch):
    real_end, threads = H.CheckpointHook.after_epoch, []

    def after_epoch(self):
        real_end(self)
        t, state = self.trainer, self.trainer.epoch_state
        # the state the background write copied, saved synchronously (the main thread has not moved on)
        save_checkpoint(t.checkpoint(state["epoch"], with_state=True), t.run_dir / f"sync{state['epoch']}.pt")
        if state["is_best"]:
            save_checkpoint(t.checkpoint(state["epoch"], with_state=False), t.run_dir / "sync_best.pt")
        threads.append(self.writer._thread)

    monkeypatch.setattr(H.CheckpointHook, "after_epoch", after_epoch)
    res = run(data, tmp_path, save_period=1)
    weights = tmp_path / "run" / "weights"
    assert all(th is not None for th in threads) and not any(th.is_alive() for th in threads)   # joined
    assert not [th for th in threading.enumerate() if th.name.startswith("libreyolo-")]
    last, sync = load_checkpoint(weights / "last.pt"), load_checkpoint(tmp_path / "run" / "sync1.pt")
    assert last["train_state"]["epoch"] == 1 and equal(last, sync)
    assert equal(load_checkpoint(weights / "epoch1.pt"), load_checkpoint(tmp_path / "run" / "sync0.pt"))
    assert equal(load_checkpoint(weights / "best.pt"), load_checkpoint(tmp_path / "run" / "sync_best.pt"))
    assert "train_state" not in load_checkpoint(weights / "best.pt") and LibreYOLO(res["best"], device="cpu").trained
    assert not [p.name for p in weights.iterdir() if p.name.endswith(".tmp")]


def failing_save(fail_on: int):
    real, calls = W.save_checkpoint, []

    def save(ckpt, path):
        calls.append(path)
        if len(calls) == fail_on:
            raise W.CheckpointSaveError(f"could not write {path}: No space left on device")
        return real(ckpt, path)
    return save


def test_a_failed_background_write_stops_the_run_at_the_next_save(data, tmp_path, monkeypatch):
    monkeypatch.setattr(W, "save_checkpoint", failing_save(1))   # epoch 1's last.pt
    epochs = []
    real_train_epoch = T.Trainer.train_epoch
    monkeypatch.setattr(T.Trainer, "train_epoch", lambda self, e: epochs.append(e) or real_train_epoch(self, e))
    with pytest.raises(W.CheckpointSaveError) as info:
        run(data, tmp_path, epochs=3)
    assert "last.pt" in str(info.value) and "checkpoint writer" in "".join(info.value.__notes__)
    assert epochs == [0, 1]   # raised in epoch 2, before its validation: no third epoch


def test_a_failed_last_write_is_raised_at_the_end(data, tmp_path, monkeypatch):
    monkeypatch.setattr(W, "save_checkpoint", failing_save(1))
    with pytest.raises(W.CheckpointSaveError) as info:
        run(data, tmp_path, epochs=1)
    assert "epoch 1's checkpoints" in "".join(info.value.__notes__)


def test_a_failed_write_is_raised_at_the_end_inside_a_callers_except_block(data, tmp_path, monkeypatch):
    """train() called while the caller handles an exception of its own: the write's error is
    still raised (that exception is not the run's)."""
    monkeypatch.setattr(W, "save_checkpoint", failing_save(1))
    with pytest.raises(W.CheckpointSaveError):
        try:
            raise KeyError("the caller's")
        except KeyError:
            run(data, tmp_path, epochs=1)


def test_a_resumed_optimizer_state_takes_its_parameters_layout():
    """A contiguous momentum for a channels_last parameter (a checkpoint written elsewhere): the
    fused SGD would pair the wrong elements; after match_state_layouts the resumed update is the
    uninterrupted one."""
    def params():
        w = torch.nn.Parameter(torch.arange(108.0).reshape(4, 3, 3, 3).contiguous(memory_format=torch.channels_last))
        return [w, torch.nn.Parameter(torch.arange(4.0))]

    def grads(ps, scale):
        for p in ps:
            p.grad = (torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) * scale).contiguous(
                memory_format=torch.channels_last if p.dim() == 4 else torch.contiguous_format)

    ref = params()
    opt = torch.optim.SGD(ref, lr=0.1, momentum=0.9, fused=True)
    for scale in (1.0, 0.5):
        grads(ref, scale)
        opt.step()
    ps = params()
    first = torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True)
    grads(ps, 1.0)
    first.step()
    sd = first.state_dict()
    sd["state"][0]["momentum_buffer"] = sd["state"][0]["momentum_buffer"].contiguous()   # as written elsewhere
    resumed = torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True)
    resumed.load_state_dict(sd)
    assert O.match_state_layouts(resumed) == 1
    assert resumed.state[ps[0]]["momentum_buffer"].stride() == ps[0].stride()
    grads(ps, 0.5)
    resumed.step()
    assert all(torch.equal(a, b) for a, b in zip(ps, ref))


def test_frozen_heap_hides_the_objects_alive_at_entry_until_the_last_block_ends(data, tmp_path, monkeypatch):
    """The run's heap is frozen for its epochs (a full collection then walks only what the run
    created) and unfrozen once the last overlapping block ends, also when a run fails; a cycle
    made before the block is collected after it."""
    import gc

    from libreyolo.engine.background import frozen_heap
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        outer = gc.get_freeze_count()
        assert outer > 1000
        with frozen_heap():
            assert gc.get_freeze_count() >= outer
        assert gc.get_freeze_count() >= outer   # the outer block still holds it
    assert gc.get_freeze_count() == 0
    with frozen_heap(enabled=False):
        assert gc.get_freeze_count() == 0
    # a reference cycle dropped while frozen is collected after the block
    import weakref

    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    with frozen_heap():
        del a, b
        gc.collect()
        assert ref() is not None   # frozen: not collected
    gc.collect()
    assert ref() is None
    # a training run: frozen during its epochs, not after it, and not after a failing one
    counts = []
    real = T.Trainer.train_epoch
    monkeypatch.setattr(T.Trainer, "train_epoch", lambda self, e: (counts.append(gc.get_freeze_count()), real(self, e))[1])
    run(data, tmp_path)
    assert counts and min(counts) > 1000 and gc.get_freeze_count() == 0

    def boom(self, e):
        raise ValueError("a failing epoch")
    monkeypatch.setattr(T.Trainer, "train_epoch", boom)
    with pytest.raises(ValueError, match="a failing epoch"):
        run(data, tmp_path, name="fails")
    assert gc.get_freeze_count() == 0
