"""Validation through the captured stage on a real GPU (libreyolo/engine/valgraph.py): the same
predictions, metrics and validation loss as eager validation, bit for bit, a padded last batch
included; a second validation after an in-place weight update replays the same graph (no new
capture) and gives eager's numbers on the new weights; a training run with cuda_graph=True
captures validation once and its last epoch's metrics are those of eager validation of the
final weights. Run through scripts/gpu-check."""
import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine import hooks as H
from libreyolo.engine.config import TrainConfig
from libreyolo.engine.evaluate import evaluate, validation_stage
from libreyolo.engine.loaders import build_loaders
from libreyolo.engine.setup import device_settings
from libreyolo.engine.verify import input_sensitive

pytestmark = pytest.mark.cuda

MODELS = [("yolo9", "t"), ("rtdetr", "r18")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # 7 validation images in batches of 3: 3 + 3 + 1, the last one padded
    return str(make_shapes_dataset(tmp_path_factory.mktemp("valgraph") / "ds", n_train=24, n_val=7, imgsz=128,
                                   seed=0))


class Validator:
    """evaluate() of a model on the split with a run's settings (device, AMP, layout), keeping its
    stage across calls as training's evaluation hook does."""

    def __init__(self, model, data, graph: bool, amp):
        cfg = TrainConfig(model.task_def, data=data, imgsz=128, batch=3, workers=0, verbose=False, cuda_graph=graph,
                          amp=amp)
        self.model, self.graph, self.stage = model, graph, None
        self.device, self.amp_dtype, cl = device_settings(model, cfg)
        self.memory_format = torch.channels_last if cl else torch.contiguous_format
        self.loader = build_loaders(model.task_def, model.task_def.resolve_data(data), model, cfg, self.device).val

    def validate(self, net, loader, loss_fn=None):
        self.stage = validation_stage(self.model, net, loader, self.graph, self.device, None, self.stage)
        self.last = evaluate(self.model, loader, net=net, device=self.device, amp_dtype=self.amp_dtype,
                             memory_format=self.memory_format, stage=self.stage, loss_fn=loss_fn)
        return self.last.metrics


def validator(model, data, graph: bool, amp):
    v = Validator(model, data, graph, amp)
    return v, v.loader


def validate(v, loader):
    metrics = v.validate(v.model.model, loader, loss_fn=v.model.build_loss().cuda())
    return metrics, v.last.loss, [p.copy() for p in v.last.evaluator.preds]


def same(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
@pytest.mark.parametrize("spec", MODELS, ids=lambda s: "-".join(s))
def test_graph_validation_bitwise_equals_eager_and_replays_new_weights(data, spec, amp):
    model = input_sensitive(LibreYOLO.new(spec[0], spec[1], nc=5, device="cuda", seed=0))
    eager, loader = validator(model, data, False, amp)
    graphed, gloader = validator(model, data, True, amp)
    m_e, loss_e, p_e = validate(eager, loader)
    m_g, loss_g, p_g = validate(graphed, gloader)
    assert sum(len(p) for p in p_e) > 0
    assert same(p_e, p_g) and m_e == m_g and torch.equal(loss_e, loss_g)
    info = graphed.stage.info()
    assert info["captures"] == 1 and info["replays"] == 3 and info["eager_calls"] == 0
    with torch.no_grad():   # in place, as the EMA update between epochs
        for p in model.model.parameters():
            if p.is_floating_point():
                p.mul_(0.95)
    m_g2, loss_g2, p_g2 = validate(graphed, gloader)
    m_e2, loss_e2, p_e2 = validate(eager, loader)
    assert not same(p_g, p_g2), "the replay did not see the new weights"
    assert same(p_e2, p_g2) and m_e2 == m_g2 and torch.equal(loss_e2, loss_g2)
    info = graphed.stage.info()
    assert info["captures"] == 1 and info["replays"] == 6 and info["invalidations"] == 0


def test_training_run_validates_through_one_graph(data, tmp_path, monkeypatch):
    """yolo9-t, 3 epochs with cuda_graph=True (whole-step graph: the EMA update inside it):
    validation captured once and replayed every epoch; the last epoch's metrics equal eager
    validation of the final (EMA) weights."""
    seen = {}
    real_end = H.EvaluationHook.after_train

    def after_train(self):
        real_end(self)
        seen["info"] = self.graph_info

    monkeypatch.setattr(H.EvaluationHook, "after_train", after_train)
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cuda", seed=0)
    res = model.train(data=data, epochs=3, batch=3, imgsz=128, workers=0, project=str(tmp_path), name="run",
                      close_mosaic=0, warmup_epochs=0, verbose=False, plots=False, seed=0, nbs=3, cuda_graph=True,
                      amp="bf16", channels_last=False)
    info = seen["info"]
    assert info["captures"] == 1 and info["replays"] == 9 and info["invalidations"] == 0
    eager, loader = validator(model, data, False, "bf16")
    metrics = eager.validate(model.model, loader)
    last = res["history"][-1]
    assert last["metrics/mAP50-95"] == metrics["map50_95"] and last["metrics/mAP50"] == metrics["map50"]
