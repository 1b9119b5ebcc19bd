"""The training loop off the step's critical path (CPU): the loss read one step late (LossFold)
gives the same epoch means as folding each step's items on the spot; a non-finite loss still stops
the run naming its epoch and batch."""
import math

import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
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
    with pytest.raises(FloatingPointError, match=rf"non-finite loss at epoch {bad // 2 + 1} batch {bad % 2}: \[nan"):
        run(tmp_path, data, epochs=2)


def test_loss_fold_on_the_host_is_the_synchronous_arithmetic():
    """LossFold itself: pushed items folded one step late give the running mean bit for bit, the
    progress fields come back as ints, a NaN raises with its epoch and batch."""
    g = torch.Generator().manual_seed(0)
    steps = [torch.rand(3, generator=g) * 10 for _ in range(7)]
    fold = T.LossFold(3, torch.device("cpu"), epoch=4)
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
    fold.push(0, fold.start(), torch.tensor([1.0, math.inf, 0.0]), {})
    with pytest.raises(FloatingPointError, match=r"epoch 5 batch 0"):
        fold.drain()
