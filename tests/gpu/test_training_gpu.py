"""Training-step capture on a real GPU (issues #3, #4). Run through scripts/gpu-check.

These establish the training parity that a family needs before it may declare
SUPPORTS_CUDA_GRAPH_TRAIN = True; they drive TrainStepRunner with supported=True and are
parametrized over rows.TRAIN_GRAPH_MODELS (a family with a loss adds a row).
"""
import logging

import pytest
import torch
from rows import SEAM_MODELS, TRAIN_GRAPH_MODELS
from whole_step import Whole, step0_eager_and_whole, whole_step

from libreyolo import LibreYOLO
from libreyolo.data.augment import DetectionDataset, collate_detections
from libreyolo.data.datasets import resolve_data
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.graphs.capture import CudaGraphCapturer
from libreyolo.graphs.training import TrainStepRunner, backward_into_grads
from libreyolo.models.registry import get_family

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    data = resolve_data(make_shapes_dataset(tmp_path_factory.mktemp("d") / "s", n_train=64, n_val=8, imgsz=256))
    ds = DetectionDataset(data.train, 256, augment=False)
    out = []
    for i in range(0, 64, 8):
        out.append(collate_detections([ds[j] for j in range(i, i + 8)], bucket=16))
    return out


FAMILY = ("yolo9", "t")


LAYOUTS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


def make(amp=False, seed=0, spec=FAMILY, layout="nchw", scaler=None):
    """A seeded net and its fwd+bwd step: bfloat16 autocast when ``amp``; with a GradScaler
    ``scaler``, float16 autocast and the loss scaled before the backward (as the trainer does)."""
    torch.manual_seed(seed)
    m = get_family(spec[0]).new(spec[1], nc=5, device="cuda", seed=seed)
    net = m.model.train().to(memory_format=LAYOUTS[layout])
    loss_fn = m.build_loss().cuda()
    params = [p for p in net.parameters() if p.requires_grad]
    dtype = torch.bfloat16 if scaler is None else torch.float16

    def step(x, t, k):
        with torch.autocast("cuda", dtype=dtype, enabled=amp or scaler is not None, cache_enabled=False):
            loss, items = loss_fn(m.train_forward(net, x, t, k), t, k)
        backward_into_grads(loss if scaler is None else scaler.scale(loss), params)   # as the trainer
        return loss.detach(), items.detach()

    return net, step


def to_dev(b):
    imgs, t, k = b
    return imgs.cuda().float().div_(255), t.cuda(), k.cuda()


@pytest.mark.parametrize("spec", TRAIN_GRAPH_MODELS, ids=lambda s: "-".join(s))
@pytest.mark.parametrize("amp", [False, True])
def test_step0_loss_and_bn_buffers_bitwise_equal(batches, amp, spec):
    x, t, k = to_dev(batches[0])
    net_e, step_e = make(amp, spec=spec)
    loss_e, _ = step_e(x, t, k)
    net_g, step_g = make(amp, spec=spec)
    graph = CudaGraphCapturer().capture(step_g, (x, t, k), module=net_g)
    for p in net_g.parameters():
        p.grad = None if p.grad is None else p.grad.zero_()
    loss_g, _ = graph.replay((x, t, k))
    torch.cuda.synchronize()
    assert torch.equal(loss_e, loss_g)
    for a, b in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, b)


def test_capture_while_pin_memory_workers_run(tmp_path):
    model = LibreYOLO.new("yolo9", "t", device="cuda")
    model.SUPPORTS_CUDA_GRAPH_TRAIN = True
    res = model.train(data=str(make_shapes_dataset(tmp_path / "s", n_train=48, n_val=8, imgsz=128)), epochs=2,
                      batch=8, imgsz=128, workers=2, project=str(tmp_path), cuda_graph=True, verbose=False)
    assert res["cuda_graph"]["replays"] > 0 and res["cuda_graph"]["disabled_reason"] is None


def test_injected_capture_failure_mid_run_finishes_eager(tmp_path, caplog, monkeypatch):
    def broken(self, fn, inputs, module=None):
        raise RuntimeError("injected capture failure")

    monkeypatch.setattr(CudaGraphCapturer, "capture", broken)
    model = LibreYOLO.new("yolo9", "t", device="cuda")
    model.SUPPORTS_CUDA_GRAPH_TRAIN = True
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        res = model.train(data=str(make_shapes_dataset(tmp_path / "s", n_train=32, n_val=8, imgsz=128)),
                          epochs=1, batch=8, imgsz=128, workers=0, project=str(tmp_path), cuda_graph=True,
                          verbose=False)
    assert sum("injected capture failure" in m for m in caplog.messages) == 1
    assert LibreYOLO(res["last"]).trained


def _accumulated_grads(batches, graph: bool, spec=FAMILY):
    net, step = make(spec=spec)
    runner = TrainStepRunner(net, step, enabled=graph, family="test", supported=True, repeat=1)
    for b in batches[:2]:
        runner(*to_dev(b))
    # a parameter the training forward leaves unused (YOLO-NAS's re-parameterized convs, kept for
    # the checkpoint layout) has no gradient: zeros, in eager and graph alike
    return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in net.parameters()]), \
        runner.info()


@pytest.mark.parametrize("spec", TRAIN_GRAPH_MODELS, ids=lambda s: "-".join(s))
def test_gradient_accumulation_parity(batches, spec):
    """Two micro-batches accumulated by replays equal two accumulated eager backwards,
    within eager's own run-to-run noise (cuDNN's weight-gradient kernels sum with atomics)."""
    e1, _ = _accumulated_grads(batches, False, spec=spec)
    e2, _ = _accumulated_grads(batches, False, spec=spec)
    g, info = _accumulated_grads(batches, True, spec=spec)
    assert info["replays"] == 2 and info["eager_steps"] == 0, info
    noise = ((e1 - e2).norm() / e1.norm()).item()
    diff = ((g - e1).norm() / e1.norm()).item()
    assert diff <= max(2 * noise, 1e-6), (noise, diff)


def make_whole(seed=0, amp=False, spec=FAMILY, optim="sgd", layout="nchw", fp16=False) -> Whole:
    """A net, its step and a capturable update (clip + fused SGD or AdamW with a tensor lr + zero_grad).
    ``fp16``: float16 autocast and a GradScaler around the update, as the trainer builds it."""
    scaler = torch.amp.GradScaler("cuda") if fp16 else None
    net, step = make(amp, seed, spec=spec, layout=layout, scaler=scaler)
    return whole_step(net, step, optim, scaler)


@pytest.mark.parametrize("spec", TRAIN_GRAPH_MODELS, ids=lambda s: "-".join(s))
@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("optim", ["sgd"])   # the detection families' WHOLE_STEP_OPTIMIZERS
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])   # nhwc: channels_last, the trainer's CUDA default
def test_whole_step_step0_loss_and_bn_buffers_bitwise_equal(batches, amp, spec, optim, layout):
    x, t, k = to_dev(batches[0])
    x = x.contiguous(memory_format=LAYOUTS[layout])
    setup = dict(amp=amp, spec=spec, optim=optim, layout=layout)
    e, loss_e, g, loss_g, runner = step0_eager_and_whole(lambda: make_whole(**setup), (x, t, k))
    net_e, net_g = e.net, g.net
    e2 = make_whole(**setup)   # eager's own noise
    e2.step(x, t, k)
    e2.update()
    net_e2 = e2.net
    assert runner.info()["captures"] == 1 and runner.info()["replays"] == 1, runner.info()
    assert torch.equal(loss_e, loss_g)
    for a, b in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, b)
    # the update inside the graph moved the weights like the eager update did, within eager's own
    # run-to-run spread: cuDNN's weight gradients sum with atomics, and AdamW's first step divides
    # by sqrt(g^2) + eps, so gradients near zero turn that noise into updates of up to lr
    moved = max((a - b).abs().max().item() for a, b in zip(net_e.parameters(), net_g.parameters()))
    noise = max((a - b).abs().max().item() for a, b in zip(net_e.parameters(), net_e2.parameters()))
    assert moved <= max(2 * noise, 1e-5), (moved, noise)


def _curve(batches, graph: bool, whole: bool, steps=20, spec=FAMILY, optim="sgd"):
    """20 training steps on two batches of one shape; the captured run replays after 3 repeats.
    ``whole``: the update (clip + fused SGD or AdamW) inside the graph too; else fwd+bwd captured, eager SGD."""
    if whole:
        w = make_whole(spec=spec, optim=optim)
        runner = TrainStepRunner(w.net, w.step, enabled=graph, family="test", supported=True, update=w.update,
                                 state=w.state)
    else:
        net, step = make(spec=spec)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        runner = TrainStepRunner(net, step, enabled=graph, family="test", supported=True)
    losses = []
    for i in range(steps):
        loss, _ = runner(*to_dev(batches[i % 2]), whole=True) if whole else runner(*to_dev(batches[i % 2]))
        if not whole:
            opt.step()
            opt.zero_grad(set_to_none=False)
        losses.append(float(loss))
    return losses, runner.info()


def _max_gap(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.parametrize("spec", TRAIN_GRAPH_MODELS, ids=lambda s: "-".join(s))
@pytest.mark.parametrize("whole", [False, True], ids=["fwd_bwd", "whole"])
def test_20_step_curve_within_eager_noise(batches, whole, spec):
    """The captured run is one more sample of eager's run-to-run spread: its largest gap to any of
    five eager runs is at most twice the largest gap among them. The noise is estimated from
    several runs because these 20-step curves drift apart chaotically: one eager pair (session 3
    run A: yolo7-tiny whole step at 2.15x it) and then three runs (session 4: picodet-s whole step,
    5.23 vs 2 x 2.55 on losses near 80, a run after the same training code had passed) were too
    few samples for a stable bound; the step-0 checks above stay bitwise."""
    eager = [_curve(batches, False, whole, spec=spec)[0] for _ in range(5)]
    g, info = _curve(batches, True, whole, spec=spec)
    assert info["captures"] >= 1 and info["replays"] >= 10, info
    noise = max(_max_gap(a, b) for i, a in enumerate(eager) for b in eager[i + 1:])
    diff = max(_max_gap(g, e) for e in eager)
    assert diff <= max(noise * 2, 1e-5 * max(abs(v) for v in eager[0])), (noise, diff)



@pytest.mark.parametrize("spec", TRAIN_GRAPH_MODELS, ids=lambda s: "-".join(s))
@pytest.mark.parametrize("whole", [False, True], ids=["fwd_bwd", "whole"])
def test_20_step_curve_with_deterministic_cudnn(batches, whole, spec, record_property):
    """The 20-step curves again with cuDNN's deterministic kernels, which take the atomics out of its
    weight gradients: where eager is then reproducible (three runs the same numbers) the captured
    curve must be those numbers exactly; where an op outside cuDNN still sums with atomics (an
    upsample's backward) eager's spread remains and the bound is the one above, on three runs."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True,
                                    allow_tf32=torch.backends.cudnn.allow_tf32):
        eager = [_curve(batches, False, whole, spec=spec)[0] for _ in range(3)]
        g, info = _curve(batches, True, whole, spec=spec)
    assert info["captures"] >= 1 and info["replays"] >= 10, info
    noise = max(_max_gap(a, b) for i, a in enumerate(eager) for b in eager[i + 1:])
    diff = max(_max_gap(g, e) for e in eager)
    record_property("noise", noise)
    record_property("diff", diff)
    if noise == 0:
        assert diff == 0, (g, eager[0])
    else:
        assert diff <= max(noise * 2, 1e-5 * max(abs(v) for v in eager[0])), (noise, diff)

def test_20_step_adamw_whole_step_curve_within_eager_noise(batches):
    """The whole step with a fused AdamW (tensor lr, primed state) replays within eager's spread."""
    eager = [_curve(batches, False, True, optim="adamw")[0] for _ in range(5)]
    g, info = _curve(batches, True, True, optim="adamw")
    assert info["captures"] >= 1 and info["replays"] >= 10, info
    noise = max(_max_gap(a, b) for i, a in enumerate(eager) for b in eager[i + 1:])
    diff = max(_max_gap(g, e) for e in eager)
    assert diff <= max(noise * 2, 1e-5 * max(abs(v) for v in eager[0])), (noise, diff)


def test_fp16_whole_step_with_grad_scaler_matches_eager_and_skips_non_finite_steps(batches):
    """float16 + GradScaler inside the whole-step graph: step-0 loss and BN buffers bitwise equal
    to eager, the same scale afterwards; a batch whose gradients are not finite leaves the weights
    untouched and halves the scale on the device, in the graph exactly as eager does."""
    x, t, k = to_dev(batches[0])
    e, loss_e, g, loss_g, runner = step0_eager_and_whole(lambda: make_whole(fp16=True), (x, t, k))
    net_e, step_e, update_e, scaler_e = e.net, e.step, e.update, e.scaler
    net_g, scaler_g = g.net, g.scaler
    assert runner.info()["captures"] == 1 and runner.info()["replays"] == 1, runner.info()
    assert torch.equal(loss_e, loss_g)
    for a, b in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, b)
    assert torch.equal(scaler_e._scale, scaler_g._scale) and torch.equal(scaler_e._growth_tracker, scaler_g._growth_tracker)
    bad = x.clone()
    bad[:, :, :4, :4] = float("inf")
    for net, run, scaler in ((net_e, lambda: (step_e(bad, t, k), update_e()), scaler_e),
                             (net_g, lambda: runner(bad, t, k, whole=True), scaler_g)):
        before = [p.detach().clone() for p in net.parameters()]
        scale = scaler._scale.clone()
        run()
        torch.cuda.synchronize()
        assert all(torch.equal(a, p) for a, p in zip(before, net.parameters())), "a non-finite step moved the weights"
        assert torch.equal(scaler._scale, scale * 0.5) and int(scaler._growth_tracker) == 0
    assert runner.info()["replays"] == 2 and runner.info()["captures"] == 1, runner.info()


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_trainer_whole_step_mode_runs_captured(tmp_path, amp):
    """train(cuda_graph=True) with SGD and bf16 or float16 (GradScaler) takes the whole-step path and replays it."""
    model = LibreYOLO.new("yolo9", "t", device="cuda")
    model.SUPPORTS_CUDA_GRAPH_TRAIN = True
    # nbs=16: two micro-batches per update, so both the fwd+bwd graph and the whole-step graph replay
    res = model.train(data=str(make_shapes_dataset(tmp_path / "s", n_train=64, n_val=8, imgsz=128)), epochs=2,
                      batch=8, nbs=16, imgsz=128, workers=2, project=str(tmp_path), cuda_graph=True, amp=amp,
                      warmup_epochs=0, verbose=False)
    g = res["cuda_graph"]
    assert g["replays"] > 0 and g["graphs"] == 2 and g["disabled_reason"] is None, g
    assert all(v == v for row in res["losses"] for v in row)


# ----------------------------------------------------------------------------- DETR seam
def make_seam(spec, graphed: bool, seed=0):
    """A DETR training step whose backbone+encoder runs through a GraphedSegment (captured at
    its first call) or eagerly; decoder, Hungarian matching and loss are eager in both."""
    from libreyolo.graphs.training import GraphedSegment
    torch.manual_seed(seed)
    m = get_family(spec[0]).new(spec[1], nc=5, device="cuda", seed=seed)
    net = m.model.train()
    loss_fn = m.build_loss().cuda()
    seg = None
    if graphed:
        seg = GraphedSegment(m.train_seam(net), name="front", repeat=1)
        m.set_train_seam(net, seg)
    params = [p for p in net.parameters() if p.requires_grad]

    def step(x, t, k):
        torch.manual_seed(1234)          # query denoising draws noise: same draws in every arm
        loss, items = loss_fn(m.train_forward(net, x, t, k), t, k)
        backward_into_grads(loss, params)   # as the trainer
        return loss.detach(), items.detach()

    return net, step, seg


@pytest.mark.parametrize("spec", SEAM_MODELS, ids=lambda s: "-".join(s))
def test_seam_step0_loss_and_bn_buffers_bitwise_equal(batches, spec):
    x, t, k = to_dev(batches[0])
    net_e, step_e, _ = make_seam(spec, graphed=False)
    loss_e, _ = step_e(x, t, k)
    net_g, step_g, seg = make_seam(spec, graphed=True)
    loss_g, _ = step_g(x, t, k)
    torch.cuda.synchronize()
    assert seg.info()["captures"] == 1 and seg.info()["replays"] == 1, seg.info()
    assert torch.equal(loss_e, loss_g)
    for a, b in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("spec", SEAM_MODELS, ids=lambda s: "-".join(s))
def test_seam_gradients_equal_all_eager_within_noise(batches, spec):
    """Captured backbone+encoder + eager decoder: the accumulated gradients of two batches equal
    all-eager within eager's own run-to-run noise."""
    def grads(graphed):
        net, step, seg = make_seam(spec, graphed)
        for b in batches[:2]:
            step(*to_dev(b))
        if seg is not None:
            assert seg.info()["replays"] == 2, seg.info()
        return torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None])

    e1, e2, g = grads(False), grads(False), grads(True)
    noise = ((e1 - e2).norm() / e1.norm()).item()
    diff = ((g - e1).norm() / e1.norm()).item()
    assert diff <= max(2 * noise, 1e-6), (noise, diff)


def test_trainer_uses_the_detr_seam(tmp_path):
    spec = SEAM_MODELS[0]
    cls = get_family(spec[0])
    model = cls.new(spec[1], device="cuda")
    model.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM = True
    res = model.train(data=str(make_shapes_dataset(tmp_path / "s", n_train=32, n_val=8, imgsz=128)), epochs=1,
                      batch=8, imgsz=128, workers=2, project=str(tmp_path), cuda_graph=True, verbose=False)
    seam = res["cuda_graph"]["seam"]
    assert seam["replays"] > 0 and seam["disabled_reason"] is None, seam
    assert "front_override" not in model.model.__dict__


def test_trainer_whole_step_with_frozen_layers_replays_and_leaves_them_untouched(tmp_path):
    """freeze=3 with cuda_graph=True: the whole step is captured over the trainable parameters only
    (the fused optimizer, clipping and the restored state never see the frozen ones), it replays,
    and the frozen weights and BatchNorm statistics are bitwise the initial ones afterwards."""
    from libreyolo.engine.optim import freeze_prefixes
    model = LibreYOLO.new("yolo9", "t", device="cuda", seed=0)
    model.SUPPORTS_CUDA_GRAPH_TRAIN = True
    prefixes = freeze_prefixes(model.model, 3)
    before = {k: v.detach().clone() for k, v in model.model.state_dict().items()
              if any(k.startswith(p + ".") for p in prefixes)}
    assert before
    res = model.train(data=str(make_shapes_dataset(tmp_path / "s", n_train=64, n_val=8, imgsz=128)), epochs=2,
                      batch=8, nbs=8, imgsz=128, workers=2, project=str(tmp_path), cuda_graph=True, amp="bf16",
                      warmup_epochs=0, freeze=3, verbose=False)
    g = res["cuda_graph"]
    assert g["replays"] > 0 and g["disabled_reason"] is None, g
    after = LibreYOLO(res["last"], device="cuda").model.state_dict()
    for k, v in before.items():
        assert torch.equal(v, after[k]), k
