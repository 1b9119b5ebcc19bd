"""The training loop off the step's critical path (CPU): the loss read one step late (LossFold)
gives the same epoch means as folding each step's items on the spot; a non-finite loss still stops
the run naming its epoch and batch; the next epoch's loader started before validation
(prefetch_next_epoch) gives the same batches and history as starting it at the epoch, also
across a resume; a run that stops with an epoch prefetched leaves no worker running."""
import math
import multiprocessing
import time

import pytest
import torch
from interrupt import interrupted_after_last_pt  # tests/interrupt.py
from tuning import tune_defaults  # tests/tuning.py

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine import hooks as H
from libreyolo.engine import loaders as LD
from libreyolo.engine import step as S
from libreyolo.engine import trainer as T


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("loop") / "ds", n_train=16, n_val=4, imgsz=64, seed=0))


def run(tmp_path, data, **kw):
    args = dict(data=data, epochs=2, batch=8, imgsz=64, workers=0, project=str(tmp_path), name="run",
                close_mosaic=1, warmup_epochs=1, verbose=False, plots=False, seed=0, nbs=16)
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
    return model.train(**{**args, **kw})


REAL_STEP = T.Trainer.step


def recording_steps(monkeypatch) -> list:
    """Patch Trainer.step to record (ni, the loader batch, the returned items) of every step,
    into a new list (replacing an earlier recording)."""
    real, seen = REAL_STEP, []

    def step(self, ni, batch):
        items = real(self, ni, batch)
        seen.append((ni, [t.clone() for t in batch], items.clone()))
        return items

    monkeypatch.setattr(T.Trainer, "step", step)
    return seen


def numbers(history) -> list[dict]:
    """A run's history less its timings (the part that must not move by a bit)."""
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in history]


def test_epoch_means_are_the_fold_of_each_steps_items(data, tmp_path, monkeypatch):
    """history's train losses equal (mloss * i + items) / (i + 1) in float32 on the host, step by
    step, as the loop computed them before it read the items one step late; verbose on, so the
    progress-bar fields (read from the lagged copy) are exercised too."""
    seen = recording_steps(monkeypatch)
    res = run(tmp_path, data, epochs=2, verbose=True)
    nb = len(seen) // 2
    assert nb == 2 and [ni for ni, _, _ in seen] == list(range(2 * nb))
    for epoch, row in enumerate(res["history"]):
        mloss = torch.zeros(len(res["loss_names"]))
        for i in range(nb):
            items = seen[epoch * nb + i][2]
            assert items.dtype == torch.float32
            mloss = (mloss * i + items) / (i + 1)
        assert [row[f"train/{n}_loss"] for n in res["loss_names"]] == [float(v) for v in mloss.tolist()]
    for row in res["history"]:   # the step's and the sync's share of the epoch are accounted
        assert 0.0 < row["time/step_device_s"] <= row["time/epoch_s"] and row["time/sync_wait_s"] >= 0.0


@pytest.mark.parametrize("bad", [3, 1])   # epoch 2's last batch (after the loop), epoch 1's second
def test_a_non_finite_loss_names_its_epoch_and_batch(data, tmp_path, monkeypatch, bad):
    real = T.Trainer.step

    def step(self, ni, batch):
        items = real(self, ni, batch)
        return items * float("nan") if ni == bad else items

    monkeypatch.setattr(T.Trainer, "step", step)
    # nan_patience=1: the first non-finite epoch stops the run (TrainingDiverged, a FloatingPointError)
    with pytest.raises(FloatingPointError, match=rf"non-finite loss at epoch {bad // 2 + 1} batch {bad % 2}: \[nan"):
        run(tmp_path, data, epochs=2, nan_patience=1)


def test_loss_fold_on_the_host_is_the_synchronous_arithmetic():
    """LossFold itself: pushed items folded one step late give the running mean bit for bit, the
    progress fields come back as ints, a non-finite loss is counted and named with its epoch and
    batch (the trainer decides what to do: StopHook.check_finite)."""
    g = torch.Generator().manual_seed(0)
    steps = [torch.rand(3, generator=g) * 10 for _ in range(7)]
    fold = S.LossFold(3, torch.device("cpu"), epoch=4)
    for i, items in enumerate(steps):
        fold.push(i, fold.start(), items, {"inst": torch.tensor(i + 2), "size": 64})
        if len(fold.pending) > 1:
            fold.fold()
            assert fold.counts == {"inst": i + 1, "size": 64}
    fold.drain()
    mloss = torch.zeros(3)
    for i, items in enumerate(steps):
        mloss = (mloss * i + items) / (i + 1)
    assert torch.equal(fold.mloss, mloss) and fold.device_s >= 0.0
    assert fold.nonfinite == 0 and fold.first_nonfinite is None
    fold.push(0, fold.start(), torch.tensor([1.0, math.inf, 0.0]), {})
    fold.drain()
    assert fold.nonfinite == 1 and fold.first_nonfinite == "non-finite loss at epoch 5 batch 0: [1.0, inf, 0.0]"
    assert not torch.isfinite(fold.mloss).all()


def test_prefetched_epochs_see_the_same_batches_and_history(data, tmp_path, monkeypatch):
    """Persistent workers (2), 3 epochs, mosaic closed for the last: with the next epoch's loader
    started before validation (and close_mosaic before it), every batch and every number of the
    history equals a run that starts each epoch's loader at the epoch."""
    prepared_at_validation = []
    real_validate = H.EvaluationHook.validate

    def validate(self, *a, **kw):
        t = self.trainer
        prepared_at_validation.append(None if t._prepared is None else
                                      (t._prepared[0], bool(getattr(t.train_set, "mosaic_closed", False))))
        return real_validate(self, *a, **kw)

    class Recording(LD.EpochSeeded):   # the mosaic probability each sample was drawn with, in the workers
        mosaic: dict = {}

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.seen = Recording.mosaic[id(self)] = torch.full((3, len(self)), -1.0).share_memory_()

        def __getitem__(self, index):
            self.seen[int(self._epoch[0]), index] = self.dataset.mosaic
            return super().__getitem__(index)

    monkeypatch.setattr(H.EvaluationHook, "validate", validate)
    monkeypatch.setattr(LD, "EpochSeeded", Recording)
    arms = {}
    for prefetch in (True, False):
        tune_defaults(monkeypatch, prefetch_next_epoch=prefetch)
        seen = recording_steps(monkeypatch)
        Recording.mosaic.clear()
        res = run(tmp_path / str(prefetch), data, epochs=3, workers=2)
        (drawn,) = Recording.mosaic.values()
        # every sample of epochs 1-2 with mosaic on, every one of epoch 3 after close_mosaic
        assert torch.equal(drawn, torch.tensor([[1.0] * 16, [1.0] * 16, [0.0] * 16])), (prefetch, drawn)
        arms[prefetch] = (seen, res)
    # the prefetch happened: epoch 2's loader (then epoch 3's, with mosaic closed) before validation
    assert prepared_at_validation == [(1, False), (2, True), None, None, None, None]
    (a, ra), (b, rb) = arms[True], arms[False]
    assert len(a) == len(b) == 6
    for (ni, batch, items), (nj, other, items_b) in zip(a, b):
        assert ni == nj and all(torch.equal(x, y) for x, y in zip(batch, other)), ni
        assert torch.equal(items, items_b), ni
    assert numbers(ra["history"]) == numbers(rb["history"])
    # and the epochs differ (the test would see a loader that replays one epoch's batches)
    assert not torch.equal(a[0][1][0], a[2][1][0]) and not torch.equal(a[2][1][0], a[4][1][0])


def test_a_resumed_run_sees_the_batches_of_an_uninterrupted_prefetching_one(data, tmp_path, monkeypatch):
    """Epochs 2 and 3 of an uninterrupted run (each prefetched during the previous validation)
    equal those of a run interrupted after epoch 1's last.pt and resumed (epoch 2 from a freshly
    started loader): same batches, same losses, same history."""
    seen_full = recording_steps(monkeypatch)
    full = run(tmp_path / "full", data, epochs=3, workers=2)
    monkeypatch.setattr(T.Trainer, "step", REAL_STEP)
    with interrupted_after_last_pt(monkeypatch):
        run(tmp_path / "cut", data, epochs=3, workers=2)
    seen_resumed = recording_steps(monkeypatch)
    resumed = run(tmp_path / "cut", data, epochs=3, workers=2, resume=True)
    assert resumed["epochs"] == 2
    later = [s for s in seen_full if s[0] >= 2]
    assert [s[0] for s in later] == [s[0] for s in seen_resumed] == [2, 3, 4, 5]
    for (ni, batch, items), (_, other, items_b) in zip(later, seen_resumed):
        assert all(torch.equal(x, y) for x, y in zip(batch, other)), ni
        assert torch.equal(items, items_b), ni
    assert numbers(full["history"])[1:] == numbers(resumed["history"])


def test_an_early_stop_with_an_epoch_prefetched_leaves_no_worker_running(data, tmp_path, monkeypatch):
    forced = iter([0.3, 0.1, 0.2, 0.4])

    def validate(self, net, loader, progress=False, **kw):
        v = next(forced)
        return {"map50": v, "map50_95": v, "precision": 0.0, "recall": 0.0, "per_class": {}}

    prepared, real_prepare = [], T.Trainer._prepare_epoch
    monkeypatch.setattr(T.Trainer, "_prepare_epoch", lambda self, e: prepared.append(e) or real_prepare(self, e))
    monkeypatch.setattr(H.EvaluationHook, "validate", validate)
    before = set(multiprocessing.active_children())
    res = run(tmp_path, data, epochs=4, workers=2, patience=1)
    assert res["epochs"] == 2 and "early stopping after epoch 2/4" in res["stop_reason"]
    assert prepared == [0, 1, 2]   # epoch 3 was prefetched, then the run stopped
    assert set(multiprocessing.active_children()) <= before


def test_the_runs_timing_accounts_for_its_wall_and_names_the_checkpoint_wait(data, tmp_path, monkeypatch):
    """res["timing"] splits train()'s wall into set-up, epochs, validation (its evaluation part
    within it), waiting for checkpoint writes, the rest of the epochs' ends and the end: the parts
    add up to the wall measured around train(), and a slow checkpoint write shows as the next
    epoch's wait (results.csv's time/ckpt_wait_s), not as training or validation."""
    from libreyolo import weights as W
    real_save = W.save_checkpoint

    def slow_save(ckpt, path):
        time.sleep(1.0)
        return real_save(ckpt, path)

    monkeypatch.setattr(W, "save_checkpoint", slow_save)
    t0 = time.perf_counter()
    res = run(tmp_path, data, epochs=2)
    wall = time.perf_counter() - t0
    timing = res["timing"]
    parts = sum(timing[k] for k in ("setup_s", "train_s", "val_s", "ckpt_wait_s", "between_s", "end_s"))
    assert 0.9 * wall - 0.3 <= parts <= wall, (parts, wall, timing)
    h = res["history"]
    assert timing["train_s"] == pytest.approx(sum(r["time/epoch_s"] for r in h), abs=0.01)
    assert timing["val_s"] == pytest.approx(sum(r["time/val_s"] for r in h), abs=0.01)
    for r in h:
        assert 0.0 <= r["time/eval_s"] <= r["time/val_s"]
    # epoch 1's last.pt (+ best.pt) sleep 2 s in the writer while epoch 2 trains (well under that
    # on 64 px images): epoch 2's end waits for them; epoch 1 had nothing to wait for
    assert h[0]["time/ckpt_wait_s"] < 0.1 and h[1]["time/ckpt_wait_s"] > 0.2, h
    # the end joins epoch 2's write (its last.pt at least: 1 s)
    assert timing["end_s"] >= 0.3, timing
    # the epochs' ends and the end by part: they add up to their figure, and the checkpoint
    # writer's join is the end's checkpoint part (the write's wait is not in the epochs' parts)
    between, end = timing["between_parts"], timing["end_parts"]
    assert {"prepare", "EvaluationHook", "LoggingHook", "CheckpointHook"} <= between.keys(), between
    assert {"LoggingHook", "CheckpointHook", "loaders"} <= end.keys(), end
    assert sum(between.values()) == pytest.approx(timing["between_s"], abs=0.05), timing
    assert sum(end.values()) == pytest.approx(timing["end_s"], abs=0.05), timing
    # the write sleeps 1 s: the end holds it, the epochs' ends only hand the write over (their
    # bound leaves room for a loaded machine)
    assert end["CheckpointHook"] >= 0.3 and between["CheckpointHook"] < 0.7, timing
    line = T.timing_line(timing)
    assert "end " in line and "checkpoint " in line, line
    # validation by part: on the CPU every part is synchronous, so they are disjoint pieces of it
    vp = timing["val_parts"]
    assert set(vp) == {"loader", "host", "stage", "loss"} and all(v >= 0.0 for v in vp.values()), vp
    assert vp["stage"] > 0.0 and vp["loss"] > 0.0 and vp["host"] > 0.0, vp   # validation loss on
    assert sum(vp.values()) + timing["eval_s"] <= timing["val_s"] + 1e-3, (vp, timing)
    assert "host part 1.0" in T.timing_line({**timing, "val_parts": {**vp, "host": 1.0}})


def test_the_host_levers_leave_every_number_as_it_was(data, tmp_path, monkeypatch):
    """switch_interval (then restored) and join_write_before_validation=False (the write
    overlapping validation) change when the host does things, never what: the same history,
    best epoch and last.pt weights as the defaults."""
    import sys

    from libreyolo.weights import load_checkpoint
    base = run(tmp_path / "a", data, epochs=2)
    interval = sys.getswitchinterval()
    seen = []
    real_epoch = T.Trainer.train_epoch
    monkeypatch.setattr(T.Trainer, "train_epoch", lambda self, e: seen.append(sys.getswitchinterval())
                        or real_epoch(self, e))
    tune_defaults(monkeypatch, switch_interval=0.0005)
    tune_defaults(monkeypatch, join_write_before_validation=False)
    lever = run(tmp_path / "b", data, epochs=2)
    assert seen == [0.0005, 0.0005] and sys.getswitchinterval() == interval
    assert numbers(lever["history"]) == numbers(base["history"]) and lever["best_epoch"] == base["best_epoch"]
    a, b = (load_checkpoint(r["last"])["model"] for r in (base, lever))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_data_phase_keeps_the_steps_graphs_and_a_loss_change_releases_them(caplog):
    """close_mosaic changes the batches, not the captured step (which starts at the batch): the
    epoch logs it and keeps its graphs; a loss whose on_epoch says it changed releases them."""
    released = []

    class Runner:
        def release(self, why):
            released.append(why)

    class Loss:
        def __init__(self, changes_at):
            self.changes_at = changes_at

        def on_epoch(self, epoch, epochs):
            return epoch == self.changes_at

    t = object.__new__(T.Trainer)
    t.step_runner, t.val_loss_fn = Runner(), None
    t.cfg = T.TrainConfig(epochs=10)
    t.loss_fn = Loss(changes_at=8)
    t._prepared = (7, iter(()), "mosaic closed for the last 3 epochs")
    with caplog.at_level("INFO", logger="libreyolo"):
        t._phase(7)
    assert released == [] and "mosaic closed for the last 3 epochs" in caplog.text
    t._prepared = (8, iter(()), None)
    t._phase(8)
    assert released == ["Loss changed at epoch 9"]


def test_validation_prefetched_before_the_last_step_gives_the_same_numbers(data, tmp_path, monkeypatch):
    """The validation loader started before an epoch's last step (prefetch_validation) is the
    iterator validation consumes - one iter() of it per epoch, not two (a second would reset its
    persistent workers) - and the run's history and weights are those of starting it at
    validation."""
    from libreyolo.weights import load_checkpoint
    base_history = None
    results = {}
    for prefetch in (False, True):
        tune_defaults(monkeypatch, prefetch_validation=prefetch)
        iters = []
        real_iter = torch.utils.data.DataLoader.__iter__

        def counting_iter(self, real_iter=real_iter, iters=iters):
            iters.append(self)
            return real_iter(self)
        monkeypatch.setattr(torch.utils.data.DataLoader, "__iter__", counting_iter)
        ready = []
        real_validate = H.EvaluationHook.validate

        def validate(self, net, loader, *a, ready=ready, real_validate=real_validate, **kw):
            ready.append(getattr(self.trainer, "_val_batches", None) is not None)   # started before the call
            return real_validate(self, net, loader, *a, **kw)
        monkeypatch.setattr(H.EvaluationHook, "validate", validate)
        res = run(tmp_path / str(prefetch), data, epochs=2, workers=2)
        assert ready == [prefetch, prefetch]
        monkeypatch.setattr(torch.utils.data.DataLoader, "__iter__", real_iter)
        val_iters = [loader for loader in iters if loader.dataset.__class__.__name__ != "EpochSeeded"]
        assert len(val_iters) == 2, val_iters   # one per epoch's validation, prefetched or not
        results[prefetch] = res
        if base_history is None:
            base_history = numbers(res["history"])
        else:
            assert numbers(res["history"]) == base_history
    a, b = (load_checkpoint(results[p]["last"])["model"] for p in (False, True))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
