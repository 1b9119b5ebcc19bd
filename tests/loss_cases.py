"""Inputs and checks shared by the family loss tests (tests/unit/test_*_loss.py).

Each loss is called as ``loss_fn(targets, mask)`` -> ``(loss, items)`` with its network outputs
bound by the test (a list of maps, or ``(cls_maps, box_maps)``), so the checks here do not
depend on a family's output layout.
"""
from __future__ import annotations

import inspect
import math

import torch

#: per-image ``[cls, x1, y1, x2, y2]`` rows for a 64x64 input: three objects, none, one covering all
ROWS = [[[0, 4, 6, 40, 50], [2, 30, 20, 62, 60], [1, 10, 30, 30, 62]],
        [],
        [[1, 0, 0, 64, 64]]]
#: a second set of targets for the same three images (classes < 3)
OTHER_ROWS = [[[1, 20, 20, 30, 40]], [[0, 2, 2, 60, 12], [2, 40, 40, 63, 63]], []]

#: calls that read a tensor value on the host (or build one from host data) inside a loss
HOST_SYNC = (".item(", ".tolist(", "nonzero", "unique", "masked_select", "numpy", "torch.tensor(")


def padded_targets(rows: list[list[list[float]]], m: int, garbage: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image lists of [cls, x1, y1, x2, y2] -> (B, m, 5) padded targets and their (B, m) mask.

    With ``garbage`` the padding rows hold random values, which must not change anything.
    """
    b = len(rows)
    t = torch.randn(b, m, 5) * 50 if garbage else torch.zeros(b, m, 5)
    mask = torch.zeros(b, m, dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            t[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
            mask[i, :len(r)] = True
    return t, mask


def random_boxes(n: int, gen: torch.Generator, scale: float = 100.0, size: float = 50.0) -> torch.Tensor:
    """(n, 4) float64 xyxy boxes, corners in [0, scale), sides in [1, size + 1)."""
    xy = torch.rand(n, 2, generator=gen) * scale
    return torch.cat((xy, xy + torch.rand(n, 2, generator=gen) * size + 1), 1).double()


def bfloat16_and_back(outputs):
    """``outputs`` (a tensor, or lists / tuples of them) in bfloat16, and that rounded back to float32."""
    def tree(x, fn):
        return type(x)(tree(v, fn) for v in x) if isinstance(x, (list, tuple)) else fn(x)
    return tree(outputs, lambda t: t.bfloat16()), tree(outputs, lambda t: t.bfloat16().float())


def assert_no_host_sync(*objects) -> None:
    """The source of each module / function holds none of :data:`HOST_SYNC`."""
    for obj in objects:
        src = inspect.getsource(obj)
        for bad in HOST_SYNC:
            assert bad not in src, f"host-synchronising op {bad!r} in {getattr(obj, '__qualname__', obj)}"


def assert_padding_invariant(loss_fn, rows: list = ROWS, atol: float = 1e-7) -> torch.Tensor:
    """Loss and items do not change with the padded size (4 or 16 rows) or what the padding holds
    (zeros or garbage); returns the items, all finite."""
    n = max(len(r) for r in rows)
    l0, i0 = loss_fn(*padded_targets(rows, n, garbage=False))
    for m in (4, 16):
        lm, im = loss_fn(*padded_targets(rows, m, garbage=True))
        torch.testing.assert_close(lm, l0, rtol=1e-6, atol=0)
        torch.testing.assert_close(im, i0, rtol=1e-6, atol=atol)
    assert torch.isfinite(l0) and torch.isfinite(i0).all()
    return i0


def loss_without_objects(loss_fn, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, items)`` for ``b`` images without objects: no target rows at all (M = 0), which must
    equal 16 rows of padding only."""
    l0, i0 = loss_fn(torch.zeros(b, 0, 5), torch.zeros(b, 0, dtype=torch.bool))
    l16, _ = loss_fn(*padded_targets([[]] * b, 16))
    torch.testing.assert_close(l0, l16)
    return l0, i0


def assert_fixed_shapes_and_finite_backward(loss_fn, leaves: list[torch.Tensor], n_items: int,
                                            row_sets: tuple = (ROWS, OTHER_ROWS), m: int = 16) -> None:
    """For two sets of targets: a scalar loss, ``n_items`` detached items that differ between the
    sets, and a backward that anomaly mode accepts, leaving finite gradients on ``leaves``
    (accumulated over both sets; callers check which of them must be non-zero)."""
    outs = []
    for rows in row_sets:
        loss, items = loss_fn(*padded_targets(rows, m))
        with torch.autograd.detect_anomaly():          # raises on NaN anywhere in backward
            loss.backward()
        outs.append((loss, items))
    assert outs[0][0].shape == outs[1][0].shape == ()
    assert outs[0][1].shape == outs[1][1].shape == (n_items,)
    assert not outs[0][1].requires_grad and not torch.equal(outs[0][1], outs[1][1])
    assert all(torch.isfinite(p.grad).all() for p in leaves)


def assert_autocast_computes_in_float32(crit, outputs, targets: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Under bfloat16 autocast, with bfloat16 outputs, the loss is float32 and equals the loss of
    the same values in float32."""
    half, ref_inputs = bfloat16_and_back(outputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, items = crit(half, *targets)
    ref, _ = crit(ref_inputs, *targets)
    assert loss.dtype == torch.float32 and items.dtype == torch.float32
    torch.testing.assert_close(loss, ref)


def assert_graph_replay_matches_eager(loss_fn, leaves: list[torch.Tensor], batches: list) -> None:
    """Capture ``loss_fn``'s forward and backward (gradients w.r.t. the CUDA ``leaves``) in a CUDA
    graph with no host sync, then replay it on each ``(targets, mask)`` of ``batches`` copied into
    the captured inputs: loss, items and gradients equal eager's."""
    static_t, static_m = batches[0][0].clone(), batches[0][1].clone()

    def step():
        loss, items = loss_fn(static_t, static_m)
        return loss, items, torch.autograd.grad(loss, leaves)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")             # any host sync during capture raises
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            g_loss, g_items, g_grads = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for tg, tm in batches:
        static_t.copy_(tg)
        static_m.copy_(tm)
        graph.replay()
        torch.cuda.synchronize()
        e_loss, e_items = loss_fn(tg, tm)
        e_grads = torch.autograd.grad(e_loss, leaves)
        torch.testing.assert_close(g_loss, e_loss)
        torch.testing.assert_close(g_items, e_items)
        for a, b in zip(g_grads, e_grads):
            torch.testing.assert_close(a, b)


def cuda_batches(rows: list = ROWS, m: int = 16, device: str = "cuda") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The two target sets the graph-capture tests replay (``rows``, then other objects for the same
    images), padded to ``m`` rows on ``device``."""
    return [tuple(x.to(device) for x in padded_targets(r, m)) for r in (rows, [[[0, 1, 1, 20, 20]], rows[0], []])]


def optimise(step_loss, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    """``steps`` optimizer steps on the scalar ``step_loss()``; returns the losses, all finite."""
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = step_loss()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses), losses
    return losses


def fit_maps(crit, maps: list[torch.Tensor], rows: list = ROWS, steps: int = 40) -> list[float]:
    """Optimise the head maps themselves (Adam, lr 0.05) for two images with the objects of
    ``rows[0]`` and ``rows[2]``; returns the losses. The assignment follows the moving boxes."""
    params = [torch.nn.Parameter(m) for m in maps]
    tg = padded_targets([rows[0], rows[2]], 8)
    return optimise(lambda: crit(params, *tg)[0], torch.optim.Adam(params, lr=0.05), steps)


def fit_one_batch(make_net, crit, make_opt, steps: int, seed: int, probe=None) -> tuple[list[float], list[float]]:
    """Train ``make_net()`` (seeded with ``seed``) on one batch: two random 64x64 images with the
    objects of ``ROWS[0]`` and ``ROWS[2]``. Returns the losses and, with ``probe(outputs, targets,
    mask)``, its value at each step (before the update)."""
    torch.manual_seed(seed)
    net = make_net().train()
    x = torch.rand(2, 3, 64, 64)
    targets, mask = padded_targets([ROWS[0], ROWS[2]], 8)
    opt = make_opt(net.parameters())
    probed = []

    def step():
        out = net(x)
        if probe is not None:
            probed.append(probe(out, targets, mask))
        return crit(out, targets, mask)[0]
    return optimise(step, opt, steps), probed


def assert_train_forward_is_normalised(model) -> None:
    """``model.train_forward`` equals the network on ``model.normalize``'d input (eval mode, so that
    BatchNorm is deterministic); outputs are ``(cls_maps, box_maps)``."""
    model.model.eval()
    x = torch.rand(1, 3, 64, 64)
    got = model.train_forward(model.model, x, *padded_targets([[]], 1))
    want = model.model(model.normalize(x))
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        torch.testing.assert_close(a, b)


def pad_gts(gts: torch.Tensor, labels: torch.Tensor, m: int, fill_label: float, gen: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One image's (G, 4) gts and (G,) labels padded to ``m`` rows of garbage (random boxes, label
    ``fill_label``): ``(labels (1, m), boxes (1, m, 4), valid (1, m))``."""
    g = gts.shape[0]
    pad_boxes = torch.randn(1, m, 4, generator=gen) * 30
    pad_boxes[0, :g] = gts
    pad_labels = torch.full((1, m), fill_label)
    pad_labels[0, :g] = labels
    valid = torch.zeros(1, m, dtype=torch.bool)
    valid[0, :g] = True
    return pad_labels, pad_boxes, valid


def reference_dynamic_k(cost: torch.Tensor, ious: torch.Tensor, topk: int) -> torch.Tensor:
    """SimOTA's dynamic-k matching as the originals write it, for one image (eager only).

    ``cost`` and ``ious`` (V, G) over the image's candidate priors and its real gts. Each gt takes
    its ``max(1, int(sum of its topk best IoUs))`` cheapest candidates; a candidate taken by
    several gts keeps the gt of least cost. Returns the (V, G) 0/1 matching.
    """
    ks = torch.topk(ious, min(topk, ious.shape[0]), 0).values.sum(0).int().clamp(min=1)
    mm = torch.zeros_like(cost)
    for j in range(cost.shape[1]):
        mm[torch.topk(cost[:, j], int(ks[j]), largest=False).indices, j] = 1
    multi = mm.sum(1) > 1
    if multi.any():
        am = cost[multi].argmin(1)
        mm[multi] = 0
        mm[multi.nonzero().flatten(), am] = 1
    return mm
