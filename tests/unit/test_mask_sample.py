"""libreyolo.ops.mask_sample: the separable tables, the formula against grid_sample, and the
tensor way over chosen pixels (the CPU's box windows) against every pixel, and the CUDA kernel's
code in Triton's interpreter."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from libreyolo.ops import mask_sample
from libreyolo.ops.letterbox import inverse_params
from libreyolo.tasks.segment.task import sample_masks


def test_axis_table_clamps_at_the_borders_and_weights_lie_in_0_1():
    i0, i1, t = mask_sample.axis_table(100, 0.64, 0.0, 64, 16, "cpu")
    assert i0.dtype == i1.dtype == torch.int32 and t.dtype == torch.float32
    assert int(i0.min()) == 0 and int(i1.max()) == 15
    assert bool(((t >= 0) & (t < 1)).all())
    assert torch.equal(i1, (i0 + 1).clamp(max=15))
    # the first pixels map before the first logit's centre and the last past the last one's:
    # clamped there (grid_sample's border padding)
    assert float(t[0]) == 0.0 and int(i0[0]) == 0 and int(i0[-1]) == 15 and float(t[-1]) == 0.0


def test_values_are_grid_samples_up_to_rounding():
    """The masks over a box covering the image, at several thresholds, against grid_sample's
    values at the same positions thresholded: they differ only where grid_sample's value is
    within float32 rounding of the threshold."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 20, 24, generator=g)
    for resize, (h, w) in (("center", (45, 80)), ("topleft", (90, 33)), ("stretch", (31, 31))):
        canvas = 96
        sx, sy, px, py = inverse_params(h, w, canvas, resize)
        xt = mask_sample.axis_table(w, sx, px, canvas, 24, "cpu")
        yt = mask_sample.axis_table(h, sy, py, canvas, 20, "cpu")
        ref = sample_masks(logits, canvas, h, w, sx, sy, px, py)
        everywhere = torch.tensor([[-1.0, -1.0, w + 1.0, h + 1.0]]).expand(5, 4)
        for thr in (-1e-6, 0.0, 0.5):
            got = mask_sample.masks_torch(logits, xt, yt, everywhere, thr)
            differ = got != (ref > thr)
            assert not differ.any() or (ref[differ] - thr).abs().max() < 1e-5


def test_chosen_pixels_equal_the_same_pixels_of_the_whole_image():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 16, 16, generator=g)
    h, w, canvas = 40, 70, 64
    sx, sy, px, py = inverse_params(h, w, canvas, "center")
    xt = mask_sample.axis_table(w, sx, px, canvas, 16, "cpu")
    yt = mask_sample.axis_table(h, sy, py, canvas, 16, "cpu")
    boxes = torch.tensor([[2.0, 3.0, 50.0, 30.0], [10.5, 0.0, 70.0, 40.0], [-3.0, 5.5, 12.0, 8.5]])
    whole = mask_sample.masks_torch(logits, xt, yt, boxes, 0.0)
    xs = torch.tensor([[0, 5, 9, 69], [1, 2, 3, 4], [10, 11, 12, 13]])
    ys = torch.tensor([[0, 1, 39], [7, 8, 9], [5, 6, 8]])
    part = mask_sample.masks_torch(logits, xt, yt, boxes, 0.0, xs=xs, ys=ys)
    for i in range(3):
        assert torch.equal(part[i], whole[i][ys[i]][:, xs[i]])
    assert whole.any() and not whole.all()


def test_triton_way_needs_cuda():
    assert not mask_sample.available(torch.device("cpu"))


def test_axis_tables_are_built_once_per_geometry_and_equal_fresh_ones():
    sx, sy, px, py = inverse_params(360, 640, 320, "center")
    dev = torch.device("cpu")
    a = mask_sample.axis_tables(360, 640, sx, sy, px, py, 320, 80, 80, dev)
    b = mask_sample.axis_tables(360, 640, sx, sy, px, py, 320, 80, 80, dev)
    assert a is b   # the repeat call's tables are the first call's
    fresh = (mask_sample.axis_table(640, sx, px, 320, 80, dev), mask_sample.axis_table(360, sy, py, 320, 80, dev))
    for got, want in zip(a, fresh):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    other = mask_sample.axis_tables(361, 640, *inverse_params(361, 640, 320, "center"), 320, 80, 80, dev)
    assert other is not a and other[1][0].shape[0] == 361


INTERPRETER_SCRIPT = textwrap.dedent('''
    import torch
    from libreyolo.ops import mask_sample
    from libreyolo.ops.letterbox import inverse_params
    from libreyolo.tasks.segment.task import box_windows
    from mask_cases import edge_boxes

    g = torch.Generator().manual_seed(5)
    for resize, h, w, n, thr in (("center", 45, 130, 12, 0.0), ("topleft", 70, 33, 9, 0.3), ("stretch", 31, 77, 7, -0.2)):
        canvas, side = 96, 24
        logits = torch.randn(n, side, side, generator=g)
        boxes = edge_boxes(n, h, w, g)
        sx, sy, px, py = inverse_params(h, w, canvas, resize)
        xt = mask_sample.axis_table(w, sx, px, canvas, side, "cpu")
        yt = mask_sample.axis_table(h, sy, py, canvas, side, "cpu")
        ref = mask_sample.masks_torch(logits, xt, yt, boxes, thr)
        whole = mask_sample.masks_triton(logits, xt, yt, boxes, thr)
        win = mask_sample.masks_triton(logits, xt, yt, boxes, thr, windows=box_windows(boxes.numpy(), h, w))
        assert ref.any() and ref[5].any(), resize
        assert torch.equal(whole, ref), resize
        assert torch.equal(win, ref), resize
    # every window empty (every box outside the image): zeros, no launch
    none = mask_sample.masks_triton(logits[:2], xt, yt, torch.tensor([[w + 2.0, 0, w + 5, 5]] * 2),
                                    0.0, windows=box_windows([[w + 2.0, 0, w + 5, 5]] * 2, h, w))
    assert none.shape == (2, h, w) and not none.any()
    print("OK")
''')


def test_triton_kernel_whole_image_and_windowed_equal_the_tensor_way_in_the_interpreter():
    """The CUDA kernel's code run by Triton's interpreter on the CPU (TRITON_INTERPRET=1 before
    triton is imported, hence a subprocess): both launches - every pixel, and only each box's
    window after a zero fill - give masks_torch's bits; tests/gpu checks the compiled kernel."""
    pytest.importorskip("triton")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # mask_cases
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", INTERPRETER_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
