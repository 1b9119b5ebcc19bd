"""Semantic segmentation with CUDA graphs on a real GPU (rows.SEMANTIC_GRAPH_MODELS).

These are the runs a semantic family needs before it may declare SUPPORTS_CUDA_GRAPH /
SUPPORTS_CUDA_GRAPH_TRAIN: the parity protocol on the network and the predict stage (argmax in
the graph), predict with graphs equal to eager, and the training step (forward + loss +
backward) captured bitwise equal to eager at step 0. The predict and trainer tests use a
subclass with the flags on, so they run before the family's flags flip.
"""
import json

import numpy as np
import pytest
import torch
from fill import fill_state_dict
from PIL import Image
from rows import FIXTURES, SEMANTIC_GRAPH_MODELS

from conftest import FIXTURES_DIR
from libreyolo import SAMPLE_IMAGE
from libreyolo.engine.verify import verify_model
from libreyolo.graphs.capture import CudaGraphCapturer
from libreyolo.models.registry import get_family
from libreyolo.tasks.semantic.data import SemanticDataset, collate_semantic, resolve_semantic_data
from libreyolo.tasks.semantic.synthetic import make_shapes_seg_dataset

pytestmark = pytest.mark.cuda


def graphed(family):
    """The family's class with its CUDA-graph flags on (what the parity runs are to justify)."""
    cls = get_family(family)
    return type(f"Graphed{cls.__name__}", (cls,), {"SUPPORTS_CUDA_GRAPH": True, "SUPPORTS_CUDA_GRAPH_TRAIN": True})


def filled(family, size, cls=None):
    """A model with the fixture's deterministic weights (varied logits, so the argmax has work)."""
    cls = cls or get_family(family)
    name = next(n for f, s, n in FIXTURES if (f, s) == (family, size))
    fx = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    m = cls.new(size, nc=fx["checkpoint_metadata"]["nc"], device="cuda")
    m.load_state_dict(fill_state_dict(fx["layout"], tied=fx["tied"]))
    return m


@pytest.fixture(scope="module")
def images():
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    return [np.asarray(pil), np.asarray(pil.resize((640, 480))), np.asarray(pil.resize((333, 517)))]


@pytest.mark.parametrize("family,size", SEMANTIC_GRAPH_MODELS)
def test_parity_protocol_fp32_and_amp_batch_1_and_8(family, size):
    model = filled(family, size)
    results = verify_model(model, imgsz=512, batches=(1, 8), amp_dtypes=(None, model.AMP_DTYPE))
    assert len(results) == 12
    failed = [r.as_dict() for r in results if not r.passed]
    assert not failed, failed


@pytest.mark.parametrize("family,size", SEMANTIC_GRAPH_MODELS)
def test_predict_with_graph_equals_eager(family, size, images):
    model = filled(family, size, graphed(family))
    for batch, imgs in ((1, images[:1]), (2, images[:1] * 2), (3, images)):
        eager = model(imgs, batch=batch)
        for _ in range(3):   # first use, u8-stage capture, replay
            got = model(imgs, batch=batch, cuda_graph=True)
            assert all(torch.equal(a.masks.data, b.masks.data) for a, b in zip(got, eager))
    assert model.graph_info()["replays"] > 0
    amp_eager = model(images[:1], amp=True)
    for _ in range(3):
        assert torch.equal(model(images[:1], amp=True, cuda_graph=True)[0].masks.data, amp_eager[0].masks.data)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    data = resolve_semantic_data(make_shapes_seg_dataset(tmp_path_factory.mktemp("seg") / "s", n_train=8, n_val=2,
                                                         imgsz=256))
    ds = SemanticDataset(data.train, 256, data.ignore_index, "stretch")
    imgs, masks = collate_semantic([ds[i] for i in range(8)])
    return imgs.cuda().float().div_(255), masks.cuda()


def _step(family, size, amp, seed=0):
    torch.manual_seed(seed)
    m = get_family(family).new(size, nc=6, device="cuda", seed=seed)
    net = m.model.train()
    loss_fn = m.build_loss().cuda()

    def step(x, masks):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            loss, items = loss_fn(m.train_forward(net, m.preprocess.normalize(x), masks), masks)
        loss.backward()
        return loss.detach(), items.detach()

    return net, step


@pytest.mark.parametrize("family,size", SEMANTIC_GRAPH_MODELS)
@pytest.mark.parametrize("amp", [False, True])
def test_train_step0_loss_and_bn_buffers_bitwise_equal(batch, family, size, amp):
    """The decode head's dropout draws from the CUDA generator: both arms re-seed it right
    before the measured step (a replay reads the generator's state at replay time)."""
    x, masks = batch
    net_e, step_e = _step(family, size, amp)
    torch.cuda.manual_seed(123)
    loss_e, _ = step_e(x, masks)
    net_g, step_g = _step(family, size, amp)
    graph = CudaGraphCapturer().capture(step_g, (x, masks), module=net_g)
    for p in net_g.parameters():
        p.grad = None if p.grad is None else p.grad.zero_()
    torch.cuda.manual_seed(123)
    loss_g, _ = graph.replay((x, masks))
    torch.cuda.synchronize()
    assert torch.isfinite(loss_e) and torch.equal(loss_e, loss_g)
    for a, b in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("family,size", SEMANTIC_GRAPH_MODELS)
def test_trainer_captures_the_step(tmp_path, family, size):
    data = make_shapes_seg_dataset(tmp_path / "s", n_train=32, n_val=8, imgsz=128)
    model = graphed(family).new(size, nc=6, device="cuda", seed=0)
    res = model.train(data=str(data), epochs=2, batch=8, imgsz=128, workers=0, cuda_graph=True, amp="bf16",
                      project=str(tmp_path), name="run", plots=False, verbose=False)
    assert res["cuda_graph"]["replays"] > 0, res["cuda_graph"]
    assert np.isfinite(res["losses"][-1][0]) and 0.0 <= res["miou"] <= 1.0
