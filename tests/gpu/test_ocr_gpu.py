"""OCR on a GPU: both stages captured, the host seam between them, graph == eager end to end.

The detector and recognizer are re-drawn input-sensitive weights (untrained), run on a printed
page with the benchmark's options (box threshold 0, at most 10 lines), so the recognition
stage really runs on 10 lines. Run through scripts/gpu-check.
"""
import numpy as np
import pytest
import rows
import torch

from libreyolo import LibreYOLO
from libreyolo.engine.verify import input_sensitive
from libreyolo.tasks.ocr.synthetic import text_page

pytestmark = pytest.mark.cuda

OPTS = {"box_thresh": 0.0, "rec_conf": 0.0, "max_lines": 10}


def build(spec):
    model = input_sensitive(LibreYOLO.new(*spec, device="cuda", seed=0))
    if spec[0] in rows.GRAPH_PENDING:   # built for capture, not declared (rows.GRAPH_PENDING)
        model.SUPPORTS_CUDA_GRAPH = True
        model.runner.supported = True
    return model


@pytest.fixture(scope="module")
def page():
    return text_page(10, width=960)


def same(a, b):
    return a.texts.texts == b.texts.texts and torch.equal(torch.as_tensor(a.texts.data), torch.as_tensor(b.texts.data))


@pytest.mark.parametrize("spec", rows.OCR_GRAPH_MODELS, ids="-".join)
@pytest.mark.parametrize("amp", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason=rows.GRAPH_PENDING.get("ppocr", "")))] if "ppocr" in rows.GRAPH_PENDING else [False, True])
def test_det_and_rec_graphs_equal_eager_on_a_page(spec, amp, page):
    model = build(spec)
    eager = model([page, page[::-1].copy()], batch=1, imgsz=960, amp=amp, **OPTS)
    assert 1 <= len(eager[0].texts) <= 10   # lines whose decoded text is empty are dropped
    for _ in range(3):   # capture, replay, replay
        got = model([page, page[::-1].copy()], batch=1, imgsz=960, amp=amp, cuda_graph=True, **OPTS)
        assert all(same(a, b) for a, b in zip(got, eager))
    stages = [g["stage"] for g in model.graph_info()["graphs"]]
    assert any("ocr-rec" in s for s in stages) and len(stages) <= model.runner.max_graphs, stages
    assert model.graph_info()["replays"] > 0


@pytest.mark.parametrize("spec", rows.OCR_GRAPH_MODELS, ids="-".join)
def test_auto_mode_and_an_image_without_text(spec, page):
    model = build(spec)
    eager = model(page, imgsz=960, **OPTS)
    for _ in range(3):
        assert same(model(page, imgsz=960, cuda_graph="auto", **OPTS), eager)
    blank = np.full((300, 500, 3), 255, np.uint8)
    r = model(blank, imgsz=960, det_thresh=1.0, cuda_graph=True)
    assert len(r.texts) == 0 and r.to_json() == "[]"
