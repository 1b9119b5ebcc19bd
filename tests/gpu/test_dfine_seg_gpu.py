"""The DETR segment variants' training on a GPU: their seams (D-FINE-seg: backbone + encoder + mask
decoder; EC seg: backbone + encoder + the mask head's spatial side, one grid feature per decoder
layer; captured forward and backward, the decoder, Hungarian matching and the losses eager), as the
DETR seam rows of test_training_gpu.py but on the segment task's batches (boxes, their mask and the
instances' bitmaps). A variant declares SUPPORTS_CUDA_GRAPH_TRAIN_SEAM only after its rows pass.
Run through scripts/gpu-check, or ``python -m pytest tests/gpu/test_dfine_seg_gpu.py -m cuda -q``
(``-k ec`` / ``-k dfine`` for one variant).
"""
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.graphs.training import GraphedSegment, backward_into_grads
from libreyolo.tasks.segment.data import (
    SegmentDataset,
    collate_instances,
    make_shapes_inst_dataset,
    resolve_segment_data,
)

pytestmark = pytest.mark.cuda

IMGSZ = 256
#: (family, size) of the DETR segment variants whose training seam these rows prove
SEG_SEAM_MODELS = [("dfine", "n"), ("ec", "s")]


@pytest.fixture(params=SEG_SEAM_MODELS, ids=lambda r: f"{r[0]}-{r[1]}-segment", scope="module")
def row(request):
    return request.param


def new_model(row, seed=0):
    torch.manual_seed(seed)
    return LibreYOLO.new(row[0], row[1], task="segment", nc=5, device="cuda", seed=seed)


@pytest.fixture(scope="module")
def data_yaml(tmp_path_factory):
    return str(make_shapes_inst_dataset(tmp_path_factory.mktemp("d") / "si", n_train=32, n_val=8, imgsz=128))


@pytest.fixture(scope="module")
def batches(data_yaml, row):
    data = resolve_segment_data(data_yaml)
    ds = SegmentDataset(data.train, IMGSZ, new_model(row).preprocess.resize, augment=False)
    return [collate_instances([ds[j] for j in range(i, i + 8)], bucket=16) for i in range(0, 32, 8)]


def to_dev(b):
    imgs, t, k, g = b
    return imgs.cuda().float().div_(255), t.cuda(), k.cuda(), g.cuda()


def make_seam(row, graphed: bool, seed=0):
    """A segment variant's training step whose front runs through a GraphedSegment (captured at
    its first call) or eagerly; the input normalised as the trainer does."""
    m = new_model(row, seed)
    net = m.model.train()
    loss_fn = m.build_loss().cuda()
    seg = None
    if graphed:
        seg = GraphedSegment(m.train_seam(net), name="front", repeat=1)
        m.set_train_seam(net, seg)
    params = [p for p in net.parameters() if p.requires_grad]

    def step(x, t, k, g):
        torch.manual_seed(1234)          # query denoising draws noise: same draws in every arm
        loss, items = loss_fn(m.train_forward(net, m.preprocess.normalize(x), t, k, g), t, k, g)
        backward_into_grads(loss, params)   # as the trainer
        return loss.detach(), items.detach()

    return net, step, seg


def test_seam_step0_loss_and_buffers_bitwise_equal(row, batches):
    b = to_dev(batches[0])
    net_e, step_e, _ = make_seam(row, False)
    loss_e, items_e = step_e(*b)
    net_g, step_g, seg = make_seam(row, True)
    loss_g, items_g = step_g(*b)
    torch.cuda.synchronize()
    assert seg.info()["captures"] == 1 and seg.info()["replays"] == 1, seg.info()
    assert torch.equal(loss_e, loss_g) and torch.equal(items_e, items_g)
    assert items_e[-2] > 0 and items_e[-1] > 0
    for a, c in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, c)


def test_seam_gradients_equal_all_eager_within_noise(row, batches):
    """Captured front + eager decoder and losses: the accumulated gradients of two batches equal
    all-eager within eager's own run-to-run noise."""
    def grads(graphed):
        net, step, seg = make_seam(row, graphed)
        for b in batches[:2]:
            step(*to_dev(b))
        if seg is not None:
            assert seg.info()["replays"] == 2, seg.info()
        return torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None])

    e1, e2, g = grads(False), grads(False), grads(True)
    noise = ((e1 - e2).norm() / e1.norm()).item()
    diff = ((g - e1).norm() / e1.norm()).item()
    assert diff <= max(2 * noise, 1e-6), (noise, diff)


def test_trainer_uses_the_seam(tmp_path, data_yaml, row):
    model = new_model(row)
    model.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM = True   # this instance only: the class stays undeclared
    res = model.train(data=data_yaml, epochs=1, batch=8, imgsz=128, workers=2, project=str(tmp_path),
                      cuda_graph=True, verbose=False)
    seam = res["cuda_graph"]["seam"]
    assert seam["replays"] > 0 and seam["disabled_reason"] is None, seam
    assert "front_override" not in model.model.__dict__
    assert all(v == v for r in res["losses"] for v in r)
