"""Validation through the captured stage, on the CPU with the stand-in capturer: the same
predictions, metrics and validation loss as eager validation (a last partial batch included),
one capture for the whole split, replays across weight updates without a new capture."""
import math

import numpy as np
import pytest
import torch
from standin import StandInCapturer
from tuning import tune_defaults  # tests/tuning.py

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine import hooks as H
from libreyolo.engine.config import TrainConfig
from libreyolo.engine.evaluate import evaluate, validation_stage
from libreyolo.engine.loaders import build_loaders
from libreyolo.engine.verify import input_sensitive
from libreyolo.graphs.runner import GraphRunner


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # 7 validation images in batches of 3: 3 + 3 + 1, the last one padded
    return str(make_shapes_dataset(tmp_path_factory.mktemp("valgraph") / "ds", n_train=8, n_val=7, imgsz=64,
                                   seed=0))


def yolo9():
    """yolo9-t with well-scaled random weights (a fresh head scores below val_conf): there are
    predictions to compare."""
    return input_sensitive(LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0))


class Validator:
    """evaluate() of a model on the split, keeping its stage across calls (as training's evaluation
    hook keeps it for the run); graphs captured by the CPU stand-in."""

    def __init__(self, model, data, graph: bool, batch: int):
        cfg = TrainConfig(model.task_def, data=data, imgsz=64, batch=batch, workers=0, verbose=False)
        self.model, self.graph, self.stage, self.last = model, graph, None, None
        self.capturer = StandInCapturer() if graph else None
        self.loader = build_loaders(model.task_def, model.task_def.resolve_data(data), model, cfg, torch.device("cpu")).val

    def stage_for(self, net):
        self.stage = validation_stage(self.model, net, self.loader, self.graph, torch.device("cpu"), self.capturer,
                                      self.stage)
        return self.stage


def validator(model, data, graph: bool, batch: int = 3):
    v = Validator(model, data, graph, batch)
    return v, v.loader


def validate(v, loader, net=None):
    net = net if net is not None else v.model.model
    ev = v.last = evaluate(v.model, loader, net=net, stage=v.stage_for(net), loss_fn=v.model.build_loss())
    return ev.metrics, ev.loss, [p.copy() for p in ev.evaluator.preds]


def same(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


def test_graph_validation_equals_eager_with_a_padded_last_batch(data):
    model = yolo9()
    eager, loader = validator(model, data, graph=False)
    graphed, gloader = validator(model, data, graph=True)
    m_e, loss_e, p_e = validate(eager, loader)
    m_g, loss_g, p_g = validate(graphed, gloader)
    assert len(loader) == 3 and len(p_e) == 7 and sum(len(p) for p in p_e) > 0   # predictions to compare
    assert same(p_e, p_g) and m_e == m_g and torch.equal(loss_e, loss_g)
    info = graphed.stage.info()
    assert info["captures"] == 1 and info["replays"] == 3 and info["eager_calls"] == 0   # one shape for all
    assert eager.stage.info() is None                                                    # eager: no runner
    # the padding never reaches the evaluator: the last batch holds one image's predictions
    assert len(graphed.last.evaluator.gts) == 7


def test_a_failed_capture_validates_eager(data):
    model = yolo9()
    eager, loader = validator(model, data, graph=False)
    failing, floader = validator(model, data, graph=True)
    failing.capturer = StandInCapturer(fail=True)
    m_e, loss_e, p_e = validate(eager, loader)
    m_f, loss_f, p_f = validate(failing, floader)
    assert same(p_e, p_f) and m_e == m_f and torch.equal(loss_e, loss_f)
    info = failing.stage.info()
    assert info["captures"] == 0 and info["eager_calls"] == 3 and "not permitted" in info["failed_captures"][0]


def test_padding_drops_the_padded_images_outputs(data):
    """A split smaller than the batch is one batch of its own size (nothing padded); the same
    images padded into a larger batch give the same predictions."""
    model = yolo9()
    whole, loader = validator(model, data, graph=True, batch=16)
    assert whole.stage_for(model.model).batch == 7
    _, _, p_whole = validate(whole, loader)
    padded, ploader = validator(model, data, graph=True, batch=3)
    _, _, p_padded = validate(padded, ploader)
    assert len(p_whole) == len(p_padded) == 7
    for a, b in zip(p_whole, p_padded):   # other batch sizes: equal up to float rounding
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-3)


def test_replays_see_in_place_weight_updates_without_a_new_capture(data):
    """Training updates the evaluated network in place between epochs (EMA): the next
    validation replays the same graph and gives eager's numbers on the new weights; replacing a
    tensor (new storage) releases the graph."""
    model = yolo9()
    graphed, gloader = validator(model, data, graph=True)
    eager, loader = validator(model, data, graph=False)
    _, _, before = validate(graphed, gloader)
    with torch.no_grad():   # an in-place update, as ModelEMA.update does (version counters move)
        for p in model.model.parameters():
            p.mul_(0.9).add_(0.01)
    m_g, loss_g, after = validate(graphed, gloader)
    m_e, loss_e, after_eager = validate(eager, loader)
    assert not same(before, after) and same(after, after_eager) and m_g == m_e and torch.equal(loss_g, loss_e)
    info = graphed.stage.info()
    assert info["captures"] == 1 and info["invalidations"] == 0 and info["replays"] == 6
    first = next(model.model.parameters())
    first.data = first.data.clone()   # new storage: the graph would read the old one
    validate(graphed, gloader)
    info = graphed.stage.info()
    assert info["invalidations"] == 1 and info["captures"] == 2


def test_runner_watch_versions():
    """The default runner releases its graphs on an in-place change; with watch_versions=False
    only a moved or replaced tensor does."""
    net = torch.nn.Linear(3, 2)
    x = torch.ones(1, 3)
    for watch, expected in ((True, 2), (False, 1)):
        r = GraphRunner(net, "test", True, capturer=StandInCapturer(), watch_versions=watch)
        r("k", net, (x,), mode=True)
        with torch.no_grad():
            net.weight.add_(1.0)
        out = r("k", net, (x,), mode=True)
        assert torch.equal(out, net(x)) and r.captures == expected


def test_training_run_with_graph_validation_matches_eager(data, tmp_path, monkeypatch):
    """Two epochs with cuda_graph=True (the CPU trains eager; validation replays the stand-in's
    graph, captured once for both epochs over the EMA weights) give the eager run's metrics and
    validation losses."""
    args = dict(data=data, epochs=2, batch=3, imgsz=64, workers=0, project=str(tmp_path), close_mosaic=0,
                warmup_epochs=0, verbose=False, plots=False, seed=0, nbs=3)
    eager = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0).train(name="eager", **args)
    tune_defaults(monkeypatch, val_capturer=StandInCapturer())
    captured = {}
    real_end = H.EvaluationHook.after_train

    def after_train(self):
        real_end(self)
        captured.update(self.graph_info)

    monkeypatch.setattr(H.EvaluationHook, "after_train", after_train)
    graphed = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0).train(name="graph", cuda_graph=True, **args)
    assert captured["captures"] == 1 and captured["replays"] == 6 and captured["invalidations"] == 0
    for a, b in zip(eager["history"], graphed["history"]):
        keys = [k for k in a if k.startswith(("metrics/", "val/", "train/"))]
        assert keys and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in keys), (a, b)
