"""ops.interpolate.resize_bilinear: F.interpolate's forward, a deterministic backward that is the
same linear map's transpose."""
import pytest
import torch
import torch.nn.functional as F

from libreyolo.ops.interpolate import bilinear_weights, resize_bilinear

SIZES = [((16, 16), (128, 128)), ((32, 24), (128, 96)), ((7, 5), (13, 11)), ((10, 10), (4, 4)),
         ((128, 128), (128, 128)), ((33, 17), (65, 100)), ((1, 3), (4, 4))]


def reference(x, size):
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


@pytest.mark.parametrize("src,dst", SIZES)
def test_the_weights_are_the_kernels_map(src, dst):
    x = torch.randn(2, 3, *src, dtype=torch.float64)
    a_h = bilinear_weights(src[0], dst[0], dtype=torch.float64)
    a_w = bilinear_weights(src[1], dst[1], dtype=torch.float64)
    assert torch.allclose(a_h.sum(1), torch.ones(dst[0], dtype=torch.float64), atol=1e-12)
    assert ((a_h > 0).sum(1) <= 2).all()
    assert torch.allclose(a_h @ x @ a_w.t(), reference(x, dst), atol=1e-10)
    assert bilinear_weights(src[0], dst[0]).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("src,dst", SIZES)
def test_forward_is_f_interpolate_and_backward_its_transpose(src, dst, dtype):
    """The gradient against float64's: float32 and bf16 each to about its own rounding (computed
    in float32, rounded once to the input's dtype)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, *src, dtype=dtype)
    g = torch.randn(2, 3, *dst, dtype=dtype)
    mine, exact = x.clone().requires_grad_(), x.double().requires_grad_()
    out = resize_bilinear(mine, dst)
    assert out.dtype == dtype and torch.equal(out, reference(x, dst))
    out.backward(g)
    reference(exact, dst).backward(g.double())
    assert mine.grad.dtype == dtype and mine.grad.shape == x.shape
    err = ((mine.grad.double() - exact.grad).abs() / (exact.grad.abs() + 1)).max().item()
    assert err <= (1e-5 if dtype == torch.float32 else 4e-3), err   # bf16: one rounding, <= 2**-8


def test_backward_gives_the_same_bits_every_run():
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    g = torch.randn(4, 8, 64, 64)
    grads = []
    for _ in range(3):
        x.grad = None
        resize_bilinear(x, (64, 64)).backward(g)
        grads.append(x.grad.clone())
    assert all(torch.equal(grads[0], h) for h in grads[1:])


def test_without_grad_it_is_the_plain_call():
    x = torch.randn(1, 2, 5, 7)
    with torch.no_grad():
        assert torch.equal(resize_bilinear(x.requires_grad_(), torch.Size([9, 3])), reference(x, (9, 3)))
    out = resize_bilinear(torch.randn(1, 2, 5, 7), (9, 3))   # no input needs a gradient
    assert out.grad_fn is None


def test_gradcheck_in_float64():
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    # the weights are float32, so the analytic gradient matches the float64 kernel's to ~1e-7
    assert torch.autograd.gradcheck(lambda t: resize_bilinear(t, (9, 7)), (x,), atol=1e-5, rtol=1e-4)
