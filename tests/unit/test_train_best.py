"""After ``model.train()`` the model holds best.pt's weights (the epoch of best validation fitness,
not the last epoch's), says so in the log, and ``model.ckpt_path`` names best.pt."""
from __future__ import annotations

import logging

import torch

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.tasks.detect.task import DetectTask
from libreyolo.weights import load_checkpoint


def test_train_leaves_the_best_weights_in_the_model(tmp_path, monkeypatch, caplog):
    data = make_shapes_dataset(tmp_path / "ds", n_train=8, n_val=4, imgsz=64, seed=0)
    scores = iter([1.0, 0.5])   # the first epoch validates best, the second worse
    monkeypatch.setattr(DetectTask, "fitness", lambda self, metrics: next(scores))
    caplog.set_level(logging.INFO, logger="libreyolo")
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
    res = model.train(data=str(data), epochs=2, batch=8, imgsz=64, workers=0, plots=False, verbose=False,
                      project=str(tmp_path / "runs"), name="run", warmup_epochs=0, seed=0)
    assert res["best_epoch"] == 1 and res["epochs"] == 2
    assert model.ckpt_path == res["best"]
    best, last = load_checkpoint(res["best"])["model"], load_checkpoint(res["last"])["model"]
    sd = model.model.state_dict()
    assert all(torch.equal(sd[k].cpu(), v) for k, v in best.items())
    assert not all(torch.equal(sd[k].cpu(), v) for k, v in last.items())   # not the last epoch's
    assert any(r.getMessage() == f"the model holds the weights of {res['best']} (epoch 1, the best validation "
               "fitness)" for r in caplog.records)
    reloaded = LibreYOLO(res["best"], device="cpu")   # predict after train agrees with the file's model
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(model.infer(x), reloaded.infer(x)))
