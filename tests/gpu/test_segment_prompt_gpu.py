"""Promptable segmentation (MobileSAM) with CUDA graphs, on a GPU: the interactive case.

The image stage is captured per input size and the prompt stage per prompt count (padding to a
bucketed count changes the masks: tests/unit/test_segment_prompt.py); here every graphed prompt
call on a set image must equal eager bit for bit (masks and scores), fp32 and AMP, for several
counts of points and boxes, and the padded-prompt difference is shown on the GPU too. The general
rows (parity protocol, predict == eager) are in test_tasks_gpu.py. Run through scripts/gpu-check.
"""
import numpy as np
import pytest
import rows
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import input_sensitive

pytestmark = pytest.mark.cuda

#: families prompted by boxes only (PicoSAM3: one network forward per box); they have no padding point
BOX_ONLY = {"picosam3"}
ALL = getattr(rows, "SEGMENT_PROMPT_GRAPH_MODELS", [])
#: rows of families not declared yet (rows.GRAPH_PENDING): run with the flag forced on for the
#: instance, as tests/gpu/test_tasks_gpu.py does, and expected to fail (strict: a pass says "declare")
MODELS = [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=rows.GRAPH_PENDING[s[0]]))
          if s[0] in rows.GRAPH_PENDING else s for s in ALL]
POINT_MODELS = [p for p, s in zip(MODELS, ALL) if s[0] not in BOX_ONLY]
PROMPTS = [
    {"points": [[100, 120]]},
    {"points": [[100, 120], [300, 200]], "labels": [1, 0]},
    {"boxes": [[50, 60, 400, 300]]},
    {"points": [[100, 120], [300, 200], [20, 30]], "labels": [1, 0, 1], "boxes": [[50, 60, 400, 300]]},
    {"points": [[100, 120]], "multimask": False},
]
BOX_PROMPTS = [
    {"boxes": [[50, 60, 400, 300]]},
    {"boxes": [[50, 60, 400, 300], [120, 100, 330, 420]]},
    {"boxes": [[10, 20, 200, 220]], "multimask": False},
]


def ids(spec):
    return "-".join(spec)


@pytest.fixture(scope="module")
def image():
    return np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))


def build(spec):
    model = input_sensitive(LibreYOLO.new(spec[0], spec[1], device="cuda", seed=0))
    if spec[0] in rows.GRAPH_PENDING:   # built for capture, not declared: exercised here only
        model.SUPPORTS_CUDA_GRAPH = True
        model.runner.supported = True
    return model


def _same(a, b):
    return torch.equal(a.masks.data, b.masks.data) and torch.equal(a.masks.scores, b.masks.scores)


@pytest.mark.parametrize("spec", MODELS, ids=ids)
@pytest.mark.parametrize("amp", [False, True])
def test_prompt_calls_on_a_set_image_with_graphs_equal_eager(spec, amp, image):
    model = build(spec)
    prompts = BOX_PROMPTS if spec[0] in BOX_ONLY else PROMPTS
    model.set_image(image, amp=amp)
    eager = [model(**p) for p in prompts]
    model.set_image(image, amp=amp, cuda_graph=True)
    for i in range(3):     # capture, replay, replay
        got = [model(**p, cuda_graph=True) for p in prompts]
        assert all(_same(a, b) for a, b in zip(eager, got))
        graphs = model.graph_info()["graphs"]
        if i == 0:
            first = len(graphs)
        assert len(graphs) == first, graphs   # the second and third rounds replay, capture nothing
    info = model.graph_info()
    if spec[0] not in BOX_ONLY:   # one image stage, one prompt stage per prompt layout
        assert first == 1 + len(prompts), info["graphs"]
    assert info["replays"] >= 2 * len(prompts)


@pytest.mark.parametrize("spec", POINT_MODELS, ids=ids)
def test_a_padded_prompt_gives_other_masks_on_the_gpu(spec, image):
    """Why prompt counts are not bucketed (the CPU test shows the same): SAM's padding point is
    a token the others attend to. (Families prompted by boxes only have no padding point.)"""
    model = build(spec)
    with torch.no_grad():
        emb = model.get_predictor().set_image(image).embedding
        pts = torch.tensor([[[400.0, 300.0], [100.0, 80.0]]], device="cuda")
        lab = torch.tensor([[1.0, 0.0]], device="cuda")
        m0, s0 = model.decode(emb, pts, lab, None, True, model.imgsz)   # the family's call (SAM 2 / 3: three maps)
        pad_p = torch.cat([pts, torch.zeros(1, 1, 2, device="cuda")], 1)
        pad_l = torch.cat([lab, -torch.ones(1, 1, device="cuda")], 1)
        m1, s1 = model.decode(emb, pad_p, pad_l, None, True, model.imgsz)
    assert not torch.equal(m0, m1) and (m0 - m1).abs().max() > 1e-3
