"""YOLOv1 on a GPU: what ``Yolo1`` needs before it may declare SUPPORTS_CUDA_GRAPH and
SUPPORTS_CUDA_GRAPH_TRAIN (docs/families.md, "YOLOv1", gives the command). The shared GPU rows
(tests/gpu/test_training_gpu.py, test_tasks_gpu.py) run at 128-256 px, and YOLOv1 takes only
448, so its rows are here: the parity protocol, graph predict == eager, the loss captured, and the
training step (step 0 bitwise, the whole step, a 20-step curve within eager's noise, the trainer
replaying it). The declarations are set on each test's model instance only.
"""
import numpy as np
import pytest
import torch
from loss_cases import ROWS, assert_graph_replay_matches_eager, cuda_batches
from PIL import Image
from whole_step import step0_eager_and_whole, whole_step

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import input_sensitive, verify_model
from libreyolo.graphs.capture import CudaGraphCapturer
from libreyolo.graphs.training import TrainStepRunner, backward_into_grads
from libreyolo.models.yolo1.loss import Yolo1Loss

pytestmark = pytest.mark.cuda
SIZE = 448
#: loss_cases' rows (for a 64x64 input) on the 448 canvas
ROWS448 = [[[r[0], *(v * 7 for v in r[1:])] for r in img] for img in ROWS]


def build(nc=None, seed=0):
    model = LibreYOLO.new("yolo1", "t", device="cuda", seed=seed, **({} if nc is None else {"nc": nc}))
    model.SUPPORTS_CUDA_GRAPH = True      # not declared: exercised on this instance only
    model.runner.supported = True
    return model


@pytest.fixture(scope="module")
def images():
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    return [np.asarray(pil), np.asarray(pil.resize((333, 517))), np.asarray(pil.rotate(180))]


def test_parity_protocol_fp32_and_amp_batch_1_and_8():
    model = build()
    results = verify_model(model, imgsz=SIZE, batches=(1, 8), amp_dtypes=(None, model.AMP_DTYPE))
    assert len(results) >= 12
    failed = [r.as_dict() for r in results if not r.passed]
    assert not failed, failed


def test_predict_with_graph_equals_eager(images):
    model = input_sensitive(build())
    for batch, imgs in ((1, images[:1]), (1, images[1:2]), (2, images[:1] * 2), (3, images)):
        eager = model(imgs, batch=batch, conf=0.0)
        for _ in range(3):  # first use, uint8-stage capture, replay
            got = model(imgs, batch=batch, conf=0.0, cuda_graph=True)
            assert all(torch.equal(a.boxes.data, b.boxes.data) for a, b in zip(got, eager))
    assert model.graph_info()["replays"] > 0


def test_loss_graph_replay_matches_eager():
    out = torch.randn(3, 49 * 30, device="cuda").requires_grad_()
    crit = Yolo1Loss(20, 2)
    assert_graph_replay_matches_eager(lambda t, m: crit(out, t, m), [out], cuda_batches(ROWS448))


# ------------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def batches():
    model = build()
    task = model.task_def
    data = task.resolve_data("shapes")
    _, val, collate = task.datasets(data, SIZE, model, task.Options())
    return data.nc, [collate([val[j] for j in range(i, i + 8)]) for i in (0, 8)]


def to_dev(b):
    imgs, *t = b
    return (imgs.cuda().float().div_(255), *[v.cuda() for v in t])


def make(nc, amp=False, seed=0):
    torch.manual_seed(seed)
    m = build(nc=nc, seed=seed)
    net = m.model.train()
    loss_fn = m.build_loss().cuda()
    params = [p for p in net.parameters() if p.requires_grad]

    def step(x, *t):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            loss, items = loss_fn(m.train_forward(net, m.preprocess.normalize(x), *t), *t)
        backward_into_grads(loss, params)   # as the trainer
        return loss.detach(), items.detach()

    return net, step


@pytest.mark.parametrize("amp", [False, True])
def test_step0_loss_and_bn_buffers_bitwise_equal(amp, batches):
    nc, bs = batches
    inputs = to_dev(bs[0])
    net_e, step_e = make(nc, amp)
    loss_e, _ = step_e(*inputs)
    net_g, step_g = make(nc, amp)
    graph = CudaGraphCapturer().capture(step_g, inputs, module=net_g)
    for p in net_g.parameters():
        p.grad = None if p.grad is None else p.grad.zero_()
    loss_g, _ = graph.replay(inputs)
    torch.cuda.synchronize()
    assert torch.equal(loss_e, loss_g)
    for a, b in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, b)


def whole(nc, optim="sgd"):
    net, step = make(nc)
    return whole_step(net, step, optim)


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_whole_step_step0_bitwise_equal(optim, batches):
    nc, bs = batches
    inputs = to_dev(bs[0])
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True,
                                    allow_tf32=torch.backends.cudnn.allow_tf32):
        e, loss_e, g, loss_g, runner = step0_eager_and_whole(lambda: whole(nc, optim), inputs)
        others = [e.net]   # two more eager steps: their spread is eager's own noise
        for _ in range(2):
            e2 = whole(nc, optim)
            e2.step(*inputs)
            e2.update()
            others.append(e2.net)
    assert runner.info()["captures"] == 1 and runner.info()["replays"] == 1, runner.info()
    assert torch.equal(loss_e, loss_g)
    for a, b in zip(e.net.buffers(), g.net.buffers()):
        assert torch.equal(a, b)
    gap = lambda n1, n2: max((a - b).abs().max().item() for a, b in zip(n1.parameters(), n2.parameters()))  # noqa: E731
    moved = max(gap(g.net, n) for n in others)
    noise = max(gap(n1, n2) for i, n1 in enumerate(others) for n2 in others[i + 1:])
    if noise == 0:
        assert moved == 0, moved
    else:
        assert moved <= max(2 * noise, 1e-5), (moved, noise)


def test_20_step_whole_step_curve_within_eager_noise(batches):
    nc, bs = batches

    def curve(graph):
        w = whole(nc)
        runner = TrainStepRunner(w.net, w.step, enabled=graph, family="test", supported=True, update=w.update,
                                 state=w.state)
        return [float(runner(*to_dev(bs[i % 2]), whole=True)[0]) for i in range(20)], runner.info()

    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True,
                                    allow_tf32=torch.backends.cudnn.allow_tf32):
        eager = [curve(False)[0] for _ in range(4)]
        g, info = curve(True)
    assert info["captures"] >= 1 and info["replays"] >= 10, info
    gap = lambda a, b: max(abs(x - y) for x, y in zip(a, b))  # noqa: E731
    noise = max(gap(a, b) for i, a in enumerate(eager) for b in eager[i + 1:])
    diff = max(gap(g, e) for e in eager)
    if noise == 0:
        assert diff == 0, (g, eager[0])
    else:
        assert diff <= max(noise * 2, 1e-5 * max(abs(v) for v in eager[0])), (noise, diff)


def test_trainer_replays_the_whole_step(tmp_path):
    model = build()
    model.SUPPORTS_CUDA_GRAPH_TRAIN = True
    res = model.train(data="shapes", epochs=2, batch=8, nbs=16, workers=2, project=str(tmp_path), cuda_graph=True,
                      amp="bf16", warmup_epochs=0, verbose=False)
    g = res["cuda_graph"]
    assert g["replays"] > 0 and g["disabled_reason"] is None, g
    assert all(v == v for row in res["losses"] for v in row)
