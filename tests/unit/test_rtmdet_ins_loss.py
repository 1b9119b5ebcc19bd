"""RTMDet-Ins's mask loss: the reorganised computation against the straightforward one.

``RtmdetInsLoss`` takes the dice terms without the per-prior input of the dynamic convs and with
the stride-4 work in one autograd function (:class:`~libreyolo.models.rtmdet.loss._DiceTerms`);
:func:`reference_loss` below is the formulation it replaced (the anchors' relative coordinates
per pixel, :func:`~libreyolo.models.rtmdet.nn.dynamic_masks`, a x2 upsample and
:func:`dice_loss` on the gathered targets). They differ only by
float rounding: values and gradients agree to 1e-5 relative.
"""
import pytest
import torch
import torch.nn.functional as F

from libreyolo.distributed import global_sum
from libreyolo.models.rtmdet.loss import RtmdetInsLoss, _DiceTerms
from libreyolo.models.rtmdet.nn import (
    NUM_DYNAMIC_PARAMS,
    STRIDES,
    dynamic_masks,
    dynamic_masks_batched,
    resize_bilinear_cuda,
)
from libreyolo.ops.interpolate import resize_bilinear_backward


def dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-mask dice loss over the last two dims, ``1 - 2 sum(p t) / (sum(p^2) + sum(t^2))``
    with ``p = sigmoid(logits)`` and ``eps`` added to each sum of squares (mmdetection's
    DiceLoss without ``naive_dice``): the definition, summed the plain way."""
    p = logits.sigmoid().flatten(-2)
    t = target.flatten(-2)
    a = (p * t).sum(-1)
    return 1 - 2 * a / ((p * p).sum(-1) + eps + (t * t).sum(-1) + eps)


def reference_loss(fn: RtmdetInsLoss, outputs, targets, mask, gt_masks):
    """``RtmdetInsLoss.forward`` as it was first written: the masks of ``min(N, topk * M)``
    priors per image by :func:`dynamic_masks`, upsampled x2, against their gts' gathered bitmaps."""
    cls_maps, box_maps, kernel_maps, protos = outputs
    targets, mask, gt_masks = targets.float(), mask.bool(), gt_masks.float()
    if targets.shape[1] == 0:
        targets, mask = targets.new_zeros(targets.shape[0], 1, 5), mask.new_zeros(mask.shape[0], 1)
        gt_masks = gt_masks.new_zeros(gt_masks.shape[0], 1, *gt_masks.shape[-2:])
    items, fg, gt_idx, points, strides = fn._detection(list(cls_maps), list(box_maps), targets, mask)
    kernels = torch.cat([k.flatten(2) for k in kernel_maps], 2).transpose(1, 2)
    n = kernels.shape[1]
    p = min(n, fn.assigner.topk * targets.shape[1])
    order = torch.arange(n, dtype=torch.float32) / n
    sel = (fg.float() * 2 - order).topk(p, dim=1).indices
    valid = fg.gather(1, sel).float()
    params = kernels.gather(1, sel.unsqueeze(-1).expand(-1, -1, kernels.shape[-1]))
    logits = dynamic_masks(protos, params, points[sel], strides[:, 0][sel], fn.strides[0])
    logits = resize_bilinear_cuda(logits, (2 * logits.shape[-2], 2 * logits.shape[-1]))
    rows = gt_idx.gather(1, sel)
    tgt = gt_masks.gather(1, rows[..., None, None].expand(-1, -1, *gt_masks.shape[-2:]))
    num = global_sum(valid.sum()).clamp_min(1.0)
    mask_loss = (dice_loss(logits, tgt, fn.dice_eps) * valid).sum() / num * fn.mask_weight
    items = torch.cat((items, mask_loss[None]))
    return items.sum(), items.detach(), int(fg.sum())


def head_outputs(b: int, s: int, nc: int, seed: int):
    """Random train-mode outputs of ``RtmdetInsNet`` for (b, 3, s, s) inputs, as leaf tensors."""
    g = torch.Generator().manual_seed(seed)
    cls = [torch.randn(b, nc, s // st, s // st, generator=g) for st in STRIDES]
    box = [torch.rand(b, 4, s // st, s // st, generator=g) * st * 4 for st in STRIDES]
    ker = [torch.randn(b, NUM_DYNAMIC_PARAMS, s // st, s // st, generator=g) * 0.3 for st in STRIDES]
    protos = torch.randn(b, 8, s // 8, s // 8, generator=g)
    return tuple(cls), tuple(box), tuple(ker), protos


def instances(counts: list[int], m: int, s: int, nc: int, seed: int, soft: bool = False):
    """Targets (B, m, 5), mask (B, m) and (B, m, s/4, s/4) bitmaps (rectangles inside each box,
    fractional values when ``soft``) for ``counts[i]`` real instances in image i."""
    g = torch.Generator().manual_seed(seed)
    b = len(counts)
    xy = torch.rand(b, m, 2, generator=g) * s * 0.6
    wh = torch.rand(b, m, 2, generator=g) * s * 0.3 + 6
    targets = torch.cat((torch.randint(0, nc, (b, m, 1), generator=g).float(), xy, xy + wh), -1)
    mask = torch.arange(m)[None] < torch.tensor(counts)[:, None]
    targets = targets * mask[..., None]
    bitmaps = torch.zeros(b, m, s // 4, s // 4)
    for i, c in enumerate(counts):
        for j in range(c):
            x1, y1, x2, y2 = (targets[i, j, 1:] / 4).long().clamp(0, s // 4).tolist()
            bitmaps[i, j, y1:y2, x1:x2] = torch.rand(y2 - y1, x2 - x1, generator=g) if soft else 1.0
    return targets, mask, bitmaps


def grads(loss, outputs):
    leaves = [*outputs[0], *outputs[1], *outputs[2], outputs[3]]
    return torch.autograd.grad(loss, leaves)


def assert_close_rel(a, b, rtol=1e-5):
    scale = b.abs().max().clamp_min(1e-12)
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * scale)


CASES = [
    # (instances per image, padded rows M, image size, soft bitmaps)
    ([3, 1, 2], 3, 64, False),         # several images, every row real in the first
    ([2, 0, 1, 4], 8, 64, False),      # padded rows, an image without instances, N < topk * M
    ([1, 2], 4, 96, True),             # fractional bitmaps
    ([0, 0], 2, 64, False),            # no instance in the batch
    ([0, 0], 0, 64, False),            # M = 0
]


@pytest.mark.parametrize("counts,m,s,soft", CASES)
def test_ins_loss_equals_the_reference_formulation(counts, m, s, soft):
    nc = 3
    fn = RtmdetInsLoss(nc)
    outputs = tuple(tuple(t.requires_grad_() for t in o) if isinstance(o, tuple) else o.requires_grad_()
                    for o in head_outputs(len(counts), s, nc, seed=len(counts) + m))
    targets, mask, bitmaps = instances(counts, m, s, nc, seed=s + m, soft=soft)
    loss, items = fn(outputs, targets, mask, bitmaps)
    ref_loss, ref_items, n_fg = reference_loss(fn, outputs, targets, mask, bitmaps)
    assert (n_fg > 0) == (sum(counts) > 0)
    torch.testing.assert_close(items, ref_items, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-7)
    if sum(counts):
        assert items[2] > 0
    for new, ref in zip(grads(loss, outputs), grads(ref_loss, outputs)):
        assert_close_rel(new, ref)


def test_batched_dynamic_masks_equal_the_per_anchor_formulation():
    g = torch.Generator().manual_seed(3)
    protos = torch.randn(2, 8, 6, 7, generator=g, dtype=torch.float64)
    params = torch.randn(2, 5, NUM_DYNAMIC_PARAMS, generator=g, dtype=torch.float64)
    points = torch.rand(2, 5, 2, generator=g, dtype=torch.float64) * 50
    strides = torch.tensor([[8.0, 16.0, 32.0, 8.0, 16.0], [32.0, 8.0, 8.0, 16.0, 8.0]], dtype=torch.float64)
    ref = dynamic_masks(protos, params, points, strides, 8)
    torch.testing.assert_close(dynamic_masks_batched(protos, params, points, strides, 8), ref, rtol=0, atol=1e-10)
    # float32 at a 640 px canvas: the split coordinate term rounds like the per-pixel difference
    protos, params = protos.float() * 2, params.float() * 0.3
    points, strides = points.float() * 12, strides.float()
    ref64 = dynamic_masks(protos.double(), params.double(), points.double(), strides.double(), 8)
    err_new = (dynamic_masks_batched(protos, params, points, strides, 8).double() - ref64).abs().max()
    err_old = (dynamic_masks(protos, params, points, strides, 8).double() - ref64).abs().max()
    assert err_new < max(4 * err_old, 1e-6 * ref64.abs().max())


@pytest.mark.parametrize("cuda_backward", [False, True])
def test_dice_terms_gradient_matches_autograd(cuda_backward, monkeypatch):
    """The hand-written backward of the stride-4 work equals autograd's of the plain ops, with the
    CPU's upsample backward and with the one CUDA takes (``resize_bilinear``'s, run here on the CPU)."""
    if cuda_backward:
        from libreyolo.models.rtmdet import loss
        monkeypatch.setattr(loss, "resize_bilinear_cuda_backward", resize_bilinear_backward)
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.rand(2, 3, 10 * 12, generator=g, dtype=torch.float64)
    w = torch.randn(2, 2, 3, generator=g, dtype=torch.float64)
    inter, pp = _DiceTerms.apply(logits, target)
    prob = F.interpolate(logits, scale_factor=2, mode="bilinear", align_corners=False).sigmoid().flatten(2)
    ref_inter, ref_pp = (prob * target).sum(-1), (prob * prob).sum(-1)
    torch.testing.assert_close(inter, ref_inter, rtol=1e-12, atol=0)
    torch.testing.assert_close(pp, ref_pp, rtol=1e-12, atol=0)
    new = torch.autograd.grad((w[0] * inter + w[1] * pp).sum(), logits)[0]
    ref = torch.autograd.grad((w[0] * ref_inter + w[1] * ref_pp).sum(), logits)[0]
    # resize_bilinear's backward runs in float32 whatever the dtype: float32 rounding there
    tol = 1e-6 if cuda_backward else 1e-12
    torch.testing.assert_close(new, ref, rtol=tol, atol=tol * ref.abs().max())
    if not cuda_backward:
        assert torch.autograd.gradcheck(lambda x: _DiceTerms.apply(x, target), (logits,))
