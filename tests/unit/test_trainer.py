"""The trainer on the CPU: short runs on the built-in synthetic data."""
import csv
import logging
import math

import numpy as np
import pytest
import torch
from interrupt import interrupted_after_last_pt  # tests/interrupt.py
from rows import TRAIN_MODELS

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.weights import load_checkpoint


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    return str(make_shapes_dataset(root / "ds", n_train=16, n_val=8, imgsz=64, seed=0))


def small_run(tmp_path, data, **kw):
    args = dict(data=data, epochs=2, batch=8, imgsz=64, workers=0, project=str(tmp_path), name="run",
                close_mosaic=1, warmup_epochs=1, verbose=False, seed=0, nbs=16)
    args.update(kw)
    model = LibreYOLO.new("yolo9", "t", nc=80, device="cpu", seed=0)
    return model, model.train(**args)


@pytest.fixture(scope="module")
def shapes160(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes160")
    return str(make_shapes_dataset(root / "ds", n_train=96, n_val=8, imgsz=160, seed=0))


@pytest.fixture(scope="module")
def shapes96(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes96")
    return str(make_shapes_dataset(root / "ds", n_train=96, n_val=4, imgsz=64, seed=0))


@pytest.mark.parametrize("family,size,options", TRAIN_MODELS, ids=[f"{f}-{s}" for f, s, _ in TRAIN_MODELS])
def test_family_trains_two_tiny_epochs(tmp_path, shapes96, family, size, options):
    """Each trainable family through the shared trainer: two short epochs (no mosaic, 12 steps of
    8 images at 64 px), every term of the family's loss finite and active under its own names,
    weights updated and saved. Whether a loss *learns* is each family's own loss test (a tiny
    network fitting one batch); over 12 steps the epoch means move with the batch composition
    (RTMDet's / PicoDet's IoU-weighted terms even rise first), so a "falls" check here would test
    noise. The falling-loss check of the issue is YOLOv9's test_two_epochs_falling_loss_*."""
    model = LibreYOLO.new(family, size, device="cpu", seed=0)
    res = model.train(data=shapes96, epochs=2, batch=8, imgsz=64, workers=0, project=str(tmp_path), name="run",
                      close_mosaic=2, warmup_epochs=0, verbose=False, seed=0, nbs=8, val=False, plots=False,
                      **options)
    assert res["epochs"] == 2 and res["loss_names"] == list(model.build_loss().item_names)
    assert all(math.isfinite(v) and v > 0 for epoch in res["losses"] for v in epoch), res["losses"]
    trained = LibreYOLO(res["last"], device="cpu")
    before = LibreYOLO.new(family, size, nc=trained.nc, device="cpu", seed=0).model.state_dict()
    assert any(not torch.equal(v, before[k]) for k, v in trained.model.state_dict().items()
               if v.is_floating_point() and "running" not in k)


def test_the_last_curves_go_to_a_second_plot_child_beside_the_final_results_png(tmp_path, shapes160, monkeypatch):
    """With ``LoggingHook.curves_child`` (on by default on CUDA runs) the last validation's curves
    are drawn by a second, pre-started child while the first draws the final results.png; both
    children end with the run."""
    from libreyolo.engine import loggers as LG
    from libreyolo.engine import plots as P
    monkeypatch.setattr(LG.LoggingHook, "curves_child", True)
    sent, started, closed = [], [], []
    real_send, real_start, real_close = P.PlotProcess.send, P.PlotProcess.start, P.PlotProcess.close
    monkeypatch.setattr(P.PlotProcess, "send", lambda self, req: sent.append((id(self), "call" in req)) or real_send(self, req))
    monkeypatch.setattr(P.PlotProcess, "start", lambda self: started.append(id(self)) or real_start(self))
    monkeypatch.setattr(P.PlotProcess, "close", lambda self: closed.append(id(self)) or real_close(self))
    small_run(tmp_path, shapes160, epochs=2, imgsz=64, batch=8, nbs=8, warmup_epochs=0, close_mosaic=0)
    run = tmp_path / "run"
    for f in ("results.png", "pr_curve.png", "confusion_matrix.png", "val_batch0_pred.jpg"):
        assert (run / f).exists(), f
    curves = {who for who, is_call in sent if is_call}
    results = {who for who, is_call in sent if not is_call}
    assert len(started) == 1 and curves == set(started), (started, sent)   # the pre-started child drew the curves
    assert results and not results & curves                                 # the other one results.png
    assert set(started) <= set(closed) and results <= set(closed)


def test_two_epochs_falling_loss_checkpoints_csv_png(tmp_path, shapes160):
    model, res = small_run(tmp_path, shapes160, epochs=2, imgsz=160, batch=8, nbs=8, warmup_epochs=0.5,
                           close_mosaic=0)
    assert res["epochs"] == 2 and len(res["losses"]) == 2
    total = [sum(l) for l in res["losses"]]
    assert total[-1] < total[0], total
    run = tmp_path / "run"
    for f in ("weights/last.pt", "weights/best.pt", "results.csv", "results.png", "pr_curve.png",
              "confusion_matrix.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg"):
        assert (run / f).exists(), f   # the curves drawn by the plot child, the batch pictures here
    assert not (run / ".curves.npz").exists()
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    for n in res["loss_names"]:   # the validation loss beside the training one, same terms
        assert all(math.isfinite(float(r[f"val/{n}_loss"])) and float(r[f"val/{n}_loss"]) > 0 for r in rows)
    ck = load_checkpoint(run / "weights" / "best.pt")
    assert ck["model_family"] == "yolo9" and ck["nc"] == 5 and ck["names"][0] == "circle"
    back = LibreYOLO(str(run / "weights" / "last.pt"), device="cpu")
    assert back.nc == 5 and back.trained
    assert model.nc == 5 and model.names[4] == "cross"
    assert 0.0 <= res["map50"] <= 1.0


@pytest.mark.parametrize("workers", [0, 2])   # 2: persistent workers, re-seeded per epoch
def test_resume_reproduces_optimizer_ema_and_epoch_state(tmp_path, shapes, monkeypatch, workers):
    """A 2-epoch run interrupted after epoch 1 and resumed ends exactly like an uninterrupted one."""
    _, full = small_run(tmp_path / "a", shapes, epochs=2, workers=workers)
    with interrupted_after_last_pt(monkeypatch):
        small_run(tmp_path / "b", shapes, epochs=2, workers=workers)
    assert load_checkpoint(tmp_path / "b" / "run" / "weights" / "last.pt")["train_state"]["epoch"] == 0
    model = LibreYOLO.new("yolo9", "t", device="cpu", seed=0)
    resumed = model.train(data=shapes, epochs=2, batch=8, imgsz=64, workers=workers, project=str(tmp_path / "b"),
                          name="run", close_mosaic=1, warmup_epochs=1, verbose=False, seed=0, nbs=16, resume=True)
    a = load_checkpoint(tmp_path / "a" / "run" / "weights" / "last.pt")
    b = load_checkpoint(tmp_path / "b" / "run" / "weights" / "last.pt")
    assert a["train_state"]["epoch"] == b["train_state"]["epoch"] == 1
    assert a["train_state"]["ema_updates"] == b["train_state"]["ema_updates"]
    for k, v in a["model"].items():  # EMA weights
        assert torch.allclose(v.float(), b["model"][k].float(), atol=1e-6), k
    for k, v in a["train_state"]["model_raw"].items():
        assert torch.allclose(v.float(), b["train_state"]["model_raw"][k].float(), atol=1e-6), k
    sa, sb = a["train_state"]["optimizer"]["state"], b["train_state"]["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.allclose(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"], atol=1e-6)
    assert resumed["epochs"] == 1 and len(full["history"]) == 2


def test_cuda_graph_true_on_cpu_logs_one_line_and_trains(tmp_path, shapes, caplog):
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        _, res = small_run(tmp_path, shapes, epochs=1, cuda_graph=True)
    assert sum("eager" in m and "CUDA-graph" in m for m in caplog.messages) == 1
    assert res["cuda_graph"]["eager_steps"] > 0 and res["cuda_graph"]["replays"] == 0


def test_val_and_bad_options(tmp_path, shapes):
    model, _ = small_run(tmp_path, shapes, epochs=1)
    metrics = model.val(data=shapes, imgsz=64, batch=8, workers=0)
    assert set(metrics) >= {"map50", "map50_95"}
    with pytest.raises(TypeError, match="unknown training option"):
        model.train(data=shapes, epochz=3)


def test_dense_mosaic_and_mixup_options_reach_the_training_set(shapes96):
    from libreyolo.data.datasets import resolve_data
    from libreyolo.engine.config import TrainConfig
    from libreyolo.engine.loaders import build_loaders
    cpu = torch.device("cpu")
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
    for on in (False, True):
        t = build_loaders(model.task_def, resolve_data(shapes96), model, TrainConfig(
            data=shapes96, imgsz=64, batch=8, workers=0, dense_mosaic=on, mixup=0.5 if on else 0.0), cpu)
        assert t.train_set.dense_mosaic is on and t.val_set.dense_mosaic is False
        assert t.train_set.mixup == (0.5 if on else 0.0) and t.val_set.mixup == 0.0
    # training and validation images are resized as the family's predict resizes them
    for fam, size in (("yolo9", "t"), ("picodet", "s")):
        m = LibreYOLO.new(fam, size, nc=5, device="cpu", seed=0)
        t = build_loaders(m.task_def, resolve_data(shapes96), m, TrainConfig(data=shapes96, imgsz=64, batch=8, workers=0),
                          cpu)
        assert t.train_set.resize == t.val_set.resize == m.resize
    assert LibreYOLO.new("picodet", "s", device="cpu").resize == "stretch"


def test_family_training_defaults_apply_under_what_the_caller_passes(monkeypatch):
    from libreyolo.engine import trainer as tr
    monkeypatch.setattr(tr.Trainer, "train", lambda self: self.cfg)
    detr = LibreYOLO.new("rtdetr", "r18", nc=3, device="cpu", seed=0)
    cfg = detr.train(data="shapes", epochs=1)
    assert (cfg.optimizer, cfg.lr0, cfg.weight_decay, cfg.clip_grad) == ("AdamW", 1e-4, 1e-4, 0.1)
    assert (cfg.augment_policy, cfg.mosaic) == ("detr", 0.0)
    cfg = detr.train(data="shapes", epochs=1, optimizer="SGD", lr0=None)   # None = not given
    assert (cfg.optimizer, cfg.lr0) == ("SGD", 1e-4)
    yolo = LibreYOLO.new("yolo9", "t", nc=3, device="cpu", seed=0)
    cfg = yolo.train(data="shapes", epochs=1, optimizer=None)
    assert (cfg.optimizer, cfg.lr0, cfg.clip_grad, cfg.close_mosaic) == ("SGD", None, 10.0, 10)
    assert (cfg.augment_policy, cfg.mosaic) == ("yolo", 1.0)
    yolox = LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0)
    assert yolox.train(data="shapes", epochs=1).close_mosaic == 15   # with the L1 switch (its loss)
    assert yolox.train(data="shapes", epochs=1, close_mosaic=3).close_mosaic == 3
    # MixUp: YOLOX-s and larger train with it, nano/tiny and the other families do not
    assert yolox.train(data="shapes", epochs=1).mixup == 0.0 and cfg.mixup == 0.0
    yolox_s = LibreYOLO.new("yolox", "s", nc=3, device="cpu", seed=0)
    assert yolox_s.train(data="shapes", epochs=1).mixup == 1.0
    assert yolox_s.train(data="shapes", epochs=1, mixup=0.25).mixup == 0.25


@pytest.mark.parametrize("family,size", [("deimv2", "atto"), ("dfine", "n")])
def test_detr_family_trains_an_epoch_with_its_recipe(tmp_path, family, size):
    """The DETR line through the shared trainer on the CPU: AdamW, the RT-DETR augmentations on
    stretched images, Hungarian matching and the set losses; finite losses, a loadable checkpoint."""
    data = make_shapes_dataset(tmp_path / "s", n_train=16, n_val=4, imgsz=96, seed=1)
    model = LibreYOLO.new(family, size, nc=5, device="cpu", seed=0)
    res = model.train(data=str(data), epochs=1, imgsz=64, batch=4, workers=0, project=str(tmp_path),
                      warmup_epochs=0, verbose=False)
    assert all(math.isfinite(v) and v >= 0 for v in res["losses"][-1]), res["losses"]
    back = LibreYOLO(res["last"])
    assert back.trained and back.FAMILY == family and back.nc == 5


def _val_batch(nc: int = 5, b: int = 2, size: int = 64):
    """Normalized-free (B, 3, S, S) images in [0, 1] and padded detection targets (2 boxes each)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(b, 3, size, size, generator=g)
    targets = torch.zeros(b, 16, 5)
    targets[:, 0] = torch.tensor([1.0, 4.0, 6.0, 30.0, 34.0])
    targets[:, 1] = torch.tensor([3.0, 30.0, 20.0, 60.0, 58.0])
    mask = torch.zeros(b, 16, dtype=torch.bool)
    mask[:, :2] = True
    return x, targets, mask


@pytest.mark.parametrize("family,size", [(f, s) for f, s, _ in TRAIN_MODELS] + [("dfine", "n")])
def test_validation_loss_outputs_are_the_training_format_of_the_evaluated_weights(family, size):
    """Model.val_loss_outputs gives exactly what train_forward gives with the whole network in
    training format but normalization and dropout in eval mode (the definition of the validation
    loss), whether a family takes it from the recorded eval pass (YOLOv9's raw maps; YOLOv7,
    RTMDet, PicoDet: the eval output itself) or runs a second pass (YOLOX's head, the DETR
    decoder); no running statistic moves and every module's mode comes back."""
    from libreyolo.models.base import train_format

    model = LibreYOLO.new(family, size, nc=5, device="cpu", seed=0)
    net = model.model.eval()
    loss_fn = model.build_loss()
    x, targets, mask = _val_batch()
    x = model.preprocess.normalize(x)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    recorded = []
    hook = net.register_forward_hook(lambda _m, _i, o: recorded.append(o))
    with torch.no_grad():
        model.infer(x)
        torch.manual_seed(0)
        got = loss_fn(model.val_loss_outputs(net, recorded[0], x, targets, mask), targets, mask)[1]
    hook.remove()
    with torch.no_grad(), train_format(net):
        torch.manual_seed(0)
        want = loss_fn(model.train_forward(net, x, targets, mask), targets, mask)[1]
    assert torch.isfinite(got).all() and torch.equal(got, want), (got, want)
    assert not any(m.training for m in net.modules())
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())


def test_validation_loss_leaves_the_metrics_and_the_random_stream_alone(tmp_path, shapes):
    """evaluate(loss_fn=...) gives the same predictions and metrics as without it, the same loss
    on a second call, and draws nothing from torch's global generator."""
    from libreyolo.engine.config import TrainConfig
    from libreyolo.engine.evaluate import evaluate
    from libreyolo.engine.loaders import build_loaders

    model = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0)
    cfg = TrainConfig(model.task_def, data=shapes, imgsz=64, batch=4, workers=0, verbose=False)
    loader = build_loaders(model.task_def, model.task_def.resolve_data(shapes), model, cfg, torch.device("cpu")).val
    plain = evaluate(model, loader)
    preds = [p.copy() for p in plain.evaluator.preds]
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with_loss = evaluate(model, loader, loss_fn=model.build_loss())
    assert torch.equal(torch.rand(3), expected)          # the global stream is where it was
    assert repr(with_loss.metrics) == repr(plain.metrics) and plain.loss is None
    assert len(preds) == 8 and all(np.array_equal(a, b) for a, b in zip(preds, with_loss.evaluator.preds))
    first = with_loss.loss.clone()
    again = evaluate(model, loader, loss_fn=model.build_loss())
    assert torch.equal(first, again.loss) and first.shape == (len(model.build_loss().item_names),)
    assert torch.isfinite(first).all() and first.sum() > 0   # (YOLOX's L1 term is off until its last epochs)
