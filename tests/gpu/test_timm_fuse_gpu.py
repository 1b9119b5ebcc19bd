"""A fused classifier (BatchNorm folded into its convolutions, ``model.fuse()``) on CUDA: the
parity protocol (raw network and the whole predict stage, fp32 and autocast, batch 1 and 8, two
probe distributions, stale-graph check) and graphed predict equal to the same fused model run
eagerly - the graph's contract holds for the folded network as for the unfused one."""
import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import input_sensitive, verify_model

pytestmark = pytest.mark.cuda

pytest.importorskip("timm")

SPECS = [("resnet", "18"), ("efficientnetv2", "b0"), ("mobilenetv4", "s")]


def fused(family, size):
    model = input_sensitive(LibreYOLO.new(family, size, device="cuda", seed=0))
    before = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.model.modules())
    model.fuse()
    assert model.fused and sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.model.modules()) < before
    return model


@pytest.mark.parametrize("family,size", SPECS)
def test_fused_classifier_parity_protocol(family, size):
    model = fused(family, size)
    results = verify_model(model, imgsz=224, batches=(1, 8), amp_dtypes=(None, model.AMP_DTYPE))
    failed = [r.as_dict() for r in results if not r.passed]
    assert results and not failed, failed


@pytest.mark.parametrize("family,size", SPECS)
def test_fused_classifier_predict_with_graph_equals_eager(family, size):
    model = fused(family, size)
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    noise = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    for img in (np.asarray(pil), noise, np.asarray(pil.rotate(180))):
        eager = model(img, imgsz=224)[0].probs.data
        for _ in range(3):   # first use, capture, replay
            got = model(img, imgsz=224, cuda_graph=True)[0].probs.data
            assert torch.equal(torch.as_tensor(got), torch.as_tensor(eager))
    assert model.graph_info()["replays"] > 0
