"""channels_last training (NHWC network and batches, the layout CUDA's convolutions and BatchNorm
run fastest in): every family that declares it trains in it, its ops accept the layout, and what
leaves the trainer (the Model's weights, checkpoints) is back in the contiguous layout."""
import math

import pytest
import torch
from rows import CLASSIFY_SMALL_MODELS, TRAIN_MODELS

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.models.registry import get_family
from libreyolo.results import Results
from libreyolo.weights import load_checkpoint

FAMILIES = sorted({f for f, *_ in TRAIN_MODELS} | {f for f, _ in CLASSIFY_SMALL_MODELS})
SIZE = {f: s for f, s, *_ in TRAIN_MODELS} | {f: s for f, s in CLASSIFY_SMALL_MODELS}


def _batch(model, n=2, imgsz=64):
    task = model.task_def
    data = task.resolve_data({"detect": "shapes", "classify": "shapes-cls"}[task.name])
    if data.nc != model.nc:
        model.reset_classes(data.nc, data.names)
    _, val, collate = task.datasets(data, imgsz, model, task.Options())
    return collate([val[i] for i in range(n)])


@pytest.mark.parametrize("family", [f for f in FAMILIES if get_family(f).CHANNELS_LAST])
def test_declared_family_trains_in_channels_last_like_contiguous(family):
    """Forward, loss and backward in NHWC give the contiguous layout's loss (to float rounding: the
    kernels differ, and train-mode BatchNorm over a batch of two amplifies it in deep untrained
    nets - eval outputs agree to ~1e-6 relative) and gradients in every parameter; no op insists on
    NCHW (a .view would raise). This compares two layouts, not a graph with eager (that is bitwise,
    tests/gpu)."""
    losses = []
    for fmt in (torch.contiguous_format, torch.channels_last):
        model = LibreYOLO.new(family, SIZE[family], device="cpu", seed=0)
        imgs, *targets = _batch(model)
        net = model.model.train().to(memory_format=fmt)
        x = model.preprocess.normalize(imgs.float().div(255).contiguous(memory_format=fmt))
        torch.manual_seed(0)   # the same dropout / drop-path draws in both layouts
        loss, _ = model.build_loss()(model.train_forward(net, x, *targets), *targets)
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters() if p.requires_grad)
        losses.append(float(loss))
    assert math.isfinite(losses[0]) and abs(losses[0] - losses[1]) <= 1e-3 * max(1.0, abs(losses[0])), losses


def test_trainer_channels_last_run_hands_back_contiguous_weights(tmp_path):
    data = str(make_shapes_dataset(tmp_path / "s", n_train=8, n_val=4, imgsz=64, seed=0))
    model = LibreYOLO.new("yolox", "n", device="cpu", seed=0)
    res = model.train(data=data, epochs=1, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="run",
                      warmup_epochs=0, verbose=False, plots=False, channels_last=True)
    assert all(p.is_contiguous() for p in model.model.parameters())
    for name in ("best", "last"):
        ck = load_checkpoint(res[name])
        assert all(v.is_contiguous() for v in ck["model"].values())
    assert all(v.is_contiguous() for v in load_checkpoint(res["last"])["train_state"]["model_raw"].values())
    assert isinstance(model(torch.zeros(3, 64, 64, dtype=torch.uint8), imgsz=64), Results)


def test_channels_last_option_is_validated():
    from libreyolo.options import OptionError
    model = LibreYOLO.new("yolox", "n", device="cpu", seed=0)
    with pytest.raises(OptionError, match="channels_last"):
        model.train(data="shapes", epochs=1, channels_last="sideways")
