"""BiRefNet on a GPU: can torchvision's deform_conv2d be captured (the reason for - or against -
the predict seam), and the seam's claim (replayed encoder + eager decoder == all eager, bitwise).

``test_deform_conv2d_capture_verdict_matches_the_declaration`` captures ONE deform_conv2d call
standalone (first with torch's own ``torch.cuda.graph``, then with the library's capturer) and
compares replays with eager on two different inputs, bit for bit. It fails while
``BiRefNet.PREDICT_SEAM`` disagrees with what it measures: a bitwise replay means the whole
network should be captured (``PREDICT_SEAM = False``, then docs/families.md says so); anything
else (a capture error, a stale or different replay) keeps the seam, and this test is its reason.
Run with ``-s`` to see the verdict line. The seam tests force the seam on the model instance, so
they hold whichever way the declaration points.
"""
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import deform_conv2d

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import input_sensitive, verify_model
from libreyolo.graphs.capture import CudaGraphCapturer
from libreyolo.models.birefnet.model import BiRefNet

pytestmark = pytest.mark.cuda


def _deform_probes():
    """Two different (input, offset, modulator) probes shaped like a 3x3 ASPP branch at 1/32 of
    1024, and the branch's weight."""
    g = torch.Generator().manual_seed(0)
    x_a = torch.randn(2, 64, 32, 32, generator=g)
    x_b = 3 * torch.rand(2, 64, 32, 32, generator=g) + 1
    off_a = 2 * torch.randn(2, 18, 32, 32, generator=g)
    off_b = 4 * torch.rand(2, 18, 32, 32, generator=g) - 2
    m_a = 2 * torch.rand(2, 9, 32, 32, generator=g)
    m_b = 2 * torch.rand(2, 9, 32, 32, generator=g)
    w = torch.randn(256, 64, 3, 3, generator=g) / 24
    cuda = lambda ts: tuple(t.cuda() for t in ts)  # noqa: E731
    return cuda((x_a, off_a, m_a)), cuda((x_b, off_b, m_b)), w.cuda()


def _verdict_torch_graph(fn, a, b) -> str | None:
    """None when a torch.cuda.graph capture of ``fn`` replays A and B bitwise equal to eager."""
    eager_a, eager_b = fn(*a).clone(), fn(*b).clone()
    if torch.equal(eager_a, eager_b):
        return "the two probes give the same output: nothing would be shown"
    static = tuple(t.clone() for t in a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = fn(*static)
    except Exception as exc:
        return f"torch.cuda.graph capture failed: {type(exc).__name__}: {exc}"
    results = []
    for probe, ref in ((a, eager_a), (b, eager_b), (a, eager_a)):
        for s, v in zip(static, probe):
            s.copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        results.append(torch.equal(out, ref))
    if not all(results):
        return f"torch.cuda.graph replays differ from eager (A, B, A again bitwise equal: {results})"
    return None


def _verdict_library(fn, a, b) -> str | None:
    eager_a, eager_b = fn(*a).clone(), fn(*b).clone()
    try:
        graph = CudaGraphCapturer().capture(fn, a)
    except Exception as exc:
        return f"the library's capture failed: {type(exc).__name__}: {exc}"
    got = [torch.equal(graph.replay(p, clone=True), ref) for p, ref in ((a, eager_a), (b, eager_b), (a, eager_a))]
    torch.cuda.synchronize()
    return None if all(got) else f"the library's replays differ from eager (A, B, A again: {got})"


def test_deform_conv2d_capture_verdict_matches_the_declaration():
    a, b, w = _deform_probes()

    def one_call(x, offset, mask):
        return deform_conv2d(x, offset, w, None, padding=1, mask=mask)

    with torch.no_grad():
        problem = _verdict_torch_graph(one_call, a, b) or _verdict_library(one_call, a, b)
    verdict = "replays bitwise equal to eager on both probes" if problem is None else problem
    print(f"\ndeform_conv2d under CUDA-graph capture (torch {torch.__version__}): {verdict}")
    if problem is None:
        assert not BiRefNet.PREDICT_SEAM, (
            "a captured deform_conv2d replays bitwise equal to eager on two different inputs: capture the "
            "whole BiRefNet network (PREDICT_SEAM = False) and record it in docs/families.md")
    else:
        assert BiRefNet.PREDICT_SEAM, f"deform_conv2d is not bitwise capturable ({problem}): keep the seam"


def _seam_model(size="t", seed=0):
    m = input_sensitive(LibreYOLO.new("birefnet", size, device="cuda", seed=seed))
    m.PREDICT_SEAM = True            # the seam itself, whatever the family declares
    m.runner.supported = True
    return m


@pytest.mark.parametrize("amp", [None, torch.float16])
def test_seam_protocol_fp32_and_amp_batch_1_and_2(amp):
    """verify's protocol on the seam: the encoder and the uint8 stage replay bitwise (two probe
    distributions, not stale), and replayed encoder + eager decoder == all eager, bit for bit."""
    res = verify_model(_seam_model(), imgsz=256, batches=(1, 2), amp_dtypes=(amp,))
    assert len(res) == 8
    assert sum("seam:" in r.name for r in res) == 2
    failed = [r.as_dict() for r in res if not r.passed]
    assert not failed, failed


def test_seam_predict_at_1024_equals_all_eager():
    """The real predict path at BiRefNet's own size: cuda_graph=True (first call, the uint8 stage's
    capture, replays) gives the all-eager alpha bit for bit, for one image and for a batch of two."""
    m = _seam_model()
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    imgs = [np.asarray(pil), np.asarray(pil.rotate(180))]
    for batch, src in ((1, imgs[:1]), (2, imgs)):
        eager = m(src, batch=batch)
        for _ in range(3):
            got = m(src, batch=batch, cuda_graph=True)
            assert all(torch.equal(g.alpha.data, e.alpha.data) for g, e in zip(got, eager))
    info = m.graph_info()
    assert info["replays"] > 0 and not info["failed_captures"], info
