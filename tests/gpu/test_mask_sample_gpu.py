"""Instance masks on CUDA: the fused Triton kernel (libreyolo.ops.mask_sample.masks_triton) gives
the tensor way's bits (masks_torch, the same formula as separate tensor ops) for every instance
and pixel - boxes inside, across the edges, outside, empty, NaN; many instances at 720p - and
instance_masks with the kernel on (mask_sample.FUSED_ON_CUDA, which this test's pass lets us set)
equals its CPU windows on the same logits up to the logits' rounding; the windowed launch (one
zero fill, then only each box's window: mask_sample.WINDOWS_ON_CUDA, which this test's pass lets
us set) gives the same bits."""
import pytest
import torch
from mask_cases import edge_boxes

from libreyolo.ops import mask_sample
from libreyolo.ops.letterbox import inverse_params
from libreyolo.tasks.segment.task import LOGITS_CHUNK, MASK_CHUNK, box_windows, instance_masks

pytestmark = pytest.mark.cuda


class Head:
    def mask_logits(self, protos, coeffs):
        return torch.einsum("nc,chw->nhw", coeffs, protos)


@pytest.mark.skipif(not mask_sample.available(torch.device("cuda")), reason="needs Triton on CUDA")
@pytest.mark.parametrize("resize,h,w,n,thr", [("center", 720, 1280, 138, 0.0), ("topleft", 333, 177, 9, 0.3),
                                              ("stretch", 50, 90, MASK_CHUNK + 7, -0.2)])
def test_triton_masks_equal_the_tensor_way(resize, h, w, n, thr, monkeypatch):
    g = torch.Generator().manual_seed(n)
    canvas = 640
    protos = torch.randn(8, 160, 160, generator=g).cuda()
    coeffs = torch.randn(n, 8, generator=g).cuda()
    boxes = edge_boxes(n, h, w, g).cuda()
    # the logits as instance_masks computes them (per chunk: a GEMM's rounding may depend on its shape)
    logits = torch.cat([Head().mask_logits(protos, coeffs[s:s + LOGITS_CHUNK]) for s in range(0, n, LOGITS_CHUNK)])
    sx, sy, px, py = inverse_params(h, w, canvas, resize)
    xt = mask_sample.axis_table(w, sx, px, canvas, 160, "cuda")
    yt = mask_sample.axis_table(h, sy, py, canvas, 160, "cuda")
    fused = mask_sample.masks_triton(logits, xt, yt, boxes, thr)
    ref = torch.cat([mask_sample.masks_torch(logits[s:s + 16], xt, yt, boxes[s:s + 16], thr)
                     for s in range(0, n, 16)])
    assert fused.shape == (n, h, w) and fused.dtype == torch.bool
    assert torch.equal(fused, ref) and fused.any()
    assert not fused[1].any() and not fused[2].any() and not fused[4].any() and fused[3].sum() <= 1
    windowed = mask_sample.masks_triton(logits, xt, yt, boxes, thr, windows=box_windows(boxes.cpu().numpy(), h, w))
    assert torch.equal(windowed, ref)
    # instance_masks: CUDA's default with the kernel on == the tensor way on CUDA == the CPU's windows
    monkeypatch.setattr(mask_sample, "FUSED_ON_CUDA", True)
    got = instance_masks(Head(), protos, coeffs, boxes, canvas, h, w, resize, thr=thr)
    assert torch.equal(got, fused)
    assert torch.equal(instance_masks(Head(), protos, coeffs, boxes, canvas, h, w, resize, thr=thr, windows=False), fused)
    monkeypatch.setattr(mask_sample, "WINDOWS_ON_CUDA", True)
    assert torch.equal(instance_masks(Head(), protos, coeffs, boxes, canvas, h, w, resize, thr=thr), fused)
    assert torch.equal(instance_masks(Head(), protos, coeffs, boxes, canvas, h, w, resize, thr=thr,
                                      host_boxes=boxes.cpu().numpy()), fused)
    monkeypatch.setattr(mask_sample, "WINDOWS_ON_CUDA", False)
    cpu = instance_masks(Head(), protos.cpu(), coeffs.cpu(), boxes.cpu(), canvas, h, w, resize, thr=thr)
    differ = cpu != fused.cpu()
    # the CPU's einsum may round the logits differently from the GPU's: only pixels whose
    # logit is within that rounding of the threshold may differ
    if differ.any():
        sample = instance_masks(Head(), protos, coeffs, boxes, canvas, h, w, resize, thr=thr + 1e-4)
        sample_lo = instance_masks(Head(), protos, coeffs, boxes, canvas, h, w, resize, thr=thr - 1e-4)
        assert bool((sample_lo.cpu() != sample.cpu())[differ].all())
