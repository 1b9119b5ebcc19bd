"""Training-step capture policy on the CPU (stand-in capturer) and its fallbacks."""
import copy
import logging

import pytest
import torch
from torch import nn

from libreyolo.graphs.training import TrainStepRunner, prime_optimizer_state, training_state


class ReplayingGraph:
    def __init__(self, fn, inputs):
        self.fn, self.static = fn, tuple(x.clone() for x in inputs)

    def replay(self, inputs, clone=True):
        for d, s in zip(self.static, inputs):
            d.copy_(s)
        return self.fn(*self.static)


class StandIn:
    def __init__(self, fail_capture=False, fail_replay=False):
        self.fail_capture, self.fail_replay, self.captured = fail_capture, fail_replay, 0

    @staticmethod
    def can_capture(device):
        return True

    def capture(self, fn, inputs, module=None):
        if self.fail_capture:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        for _ in range(3):  # warm-up like the real capturer: it runs the step (grads accumulate!)
            fn(*inputs)
        self.captured += 1
        g = ReplayingGraph(fn, inputs)
        if self.fail_replay:
            def boom(*a, **k):
                raise RuntimeError("replay failed")
            g.replay = boom
        return g


def setup(capturer, supported=True, enabled=True):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def step(x, y, m):
        loss = ((net(x).squeeze(-1) - y) ** 2 * m).sum()
        loss.backward()
        return loss.detach(), loss.detach().reshape(1)

    return net, TrainStepRunner(net, step, enabled=enabled, family="toy", supported=supported, capturer=capturer)


def batches(n, b=5):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(b, 4, generator=g), torch.randn(b, generator=g), torch.ones(b)) for _ in range(n)]


def grads_after(runner, net, data, accumulate=2):
    out = []
    for i, batch in enumerate(data):
        runner(*batch)
        if (i + 1) % accumulate == 0:
            out.append([p.grad.clone() for p in net.parameters()])
            with torch.no_grad():
                for p in net.parameters():
                    p.grad.zero_()
    return out


def test_capture_after_three_repeats_and_accumulated_grads_equal_eager():
    data = batches(8)
    net_e, eager = setup(None, enabled=False)
    net_g, graphed = setup(StandIn())
    ge, gg = grads_after(eager, net_e, data), grads_after(graphed, net_g, data)
    for a, b in zip(ge, gg):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), "warm-up leaked into accumulated gradients"
    info = graphed.info()
    assert info["captures"] == 1 and info["eager_steps"] == 2 and info["replays"] == 6


def test_new_shape_is_a_new_graph_and_cap_is_respected():
    net, r = setup(StandIn())
    r.max_graphs = 2
    for b in (2, 3, 4):
        for batch in batches(4, b):
            r(*batch)
    assert r.info()["graphs"] == 2 and r.info()["captures"] == 3


def test_a_thrashing_cache_stops_capturing_new_shapes_with_one_line(caplog):
    """More shapes in rotation than the cache holds: each eviction costs a recapture later, so
    after as many evictions as the cache holds new shapes train eager (one warning), the graphs
    kept replay, and a release (a phase change) starts afresh."""
    cap = StandIn()
    net, r = setup(cap)
    r.max_graphs = 2
    shapes = [2, 3, 4] * 12
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        for b in shapes:
            r(*batches(1, b)[0])
    info = r.info()
    assert sum("thrashing" in m for m in caplog.messages) == 1 and info["captures_stopped"]
    assert info["evictions"] == 2 and cap.captured == 4 and info["graphs"] == 2   # then no more captures
    assert info["replays"] > 0 and info["eager_steps"] + info["replays"] == len(shapes)
    r.release("phase change")
    assert r.info()["captures_stopped"] is None
    for _ in range(3):
        r(*batches(1, 5)[0])
    assert cap.captured == 5


def test_an_evicted_shape_is_recounted_before_its_next_capture():
    cap = StandIn()
    net, r = setup(cap)
    r.max_graphs = 1
    for b in (2, 2, 2, 3, 3, 3):      # 2 captured on its third sight, then evicted by 3
        r(*batches(1, b)[0])
    assert cap.captured == 2
    r(*batches(1, 2)[0])              # seen once since its eviction: eager, no capture yet
    assert cap.captured == 2 and r.info()["eager_steps"] == 5


def test_unsupported_or_cpu_logs_one_line_and_trains_eager(caplog):
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        net, r = setup(None, supported=False)
        for batch in batches(4):
            r(*batch)
    assert sum("eager" in m for m in caplog.messages) == 1
    assert r.info()["eager_steps"] == 4 and not r.info()["active"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        net, r = setup(None)  # real capturer, CPU tensors
        for batch in batches(4):
            r(*batch)
    assert sum("CUDA device" in m for m in caplog.messages) == 1 and r.info()["eager_steps"] == 4


def test_capture_or_replay_failure_mid_run_continues_eager(caplog):
    for cap in (StandIn(fail_capture=True), StandIn(fail_replay=True)):
        data = batches(6)
        net_e, eager = setup(None, enabled=False)
        net_g, r = setup(cap)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="libreyolo"):
            ge, gg = grads_after(eager, net_e, data, 1), grads_after(r, net_g, data, 1)
        assert sum("eager" in m for m in caplog.messages) == 1
        assert not r.info()["active"] and r.info()["eager_steps"] == 6
        if cap.fail_capture:  # nothing ran twice: gradients are exactly eager's
            assert all(torch.equal(x, y) for a, b in zip(ge, gg) for x, y in zip(a, b))


def test_release_forgets_graphs():
    net, r = setup(StandIn())
    for batch in batches(4):
        r(*batch)
    r.release("phase change")
    assert r.info()["graphs"] == 0


def _whole(prime: bool = False, *, enabled: bool = True, repeat: int | None = 1, nesterov: bool = True):
    """A toy net whose runner does the whole step (SGD update inside); ``repeat=None`` keeps the
    runner's default repeat rule."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=nesterov)
    if prime:
        prime_optimizer_state(opt)

    def step(x, y, m):
        loss = ((net(x).squeeze(-1) - y) ** 2 * m).sum()
        loss.backward()
        return loss.detach(), loss.detach().reshape(1)

    def update():
        opt.step()
        opt.zero_grad(set_to_none=False)

    def state():
        return training_state(params, opt)

    kw = {} if repeat is None else {"repeat": repeat}
    return net, opt, TrainStepRunner(net, step, enabled=enabled, family="toy", supported=True, capturer=StandIn(),
                                     update=update, state=state, **kw)


def test_whole_step_restores_state_after_warmup_and_matches_eager():
    """whole=True: the update runs inside the step; capture warm-up must not advance training."""
    data = batches(8)
    net_e, _, eager = _whole(enabled=False, repeat=None, nesterov=False)
    net_g, _, graphed = _whole(repeat=None, nesterov=False)
    for b in data:
        eager(*b, whole=True)
        graphed(*b, whole=True)
    assert graphed.info()["captures"] == 1 and graphed.info()["replays"] == 6
    for a, b in zip(net_e.parameters(), net_g.parameters()):
        assert torch.equal(a, b), "warm-up steps leaked into the weights"


def test_primed_momentum_gives_the_lazy_first_step_bit_for_bit():
    data = batches(3)
    lazy, _, _ = _whole(False)
    primed, _, _ = _whole(True)
    for net in (lazy, primed):
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True)
        if net is primed:
            prime_optimizer_state(opt)
        for x, y, m in data:
            ((net(x).squeeze(-1) - y) ** 2 * m).sum().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(lazy.parameters(), primed.parameters()):
        assert torch.equal(a, b)


def test_whole_step_capture_refuses_state_created_by_warm_up(caplog):
    net, _, runner = _whole(prime=False)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        runner(*batches(1)[0], whole=True)
    assert runner.info()["disabled_reason"] and "prime_optimizer_state" in runner.info()["disabled_reason"]
    assert runner.info()["eager_steps"] == 1
    net, _, runner = _whole(prime=True)
    runner(*batches(1)[0], whole=True)
    assert runner.info()["captures"] == 1 and runner.info()["disabled_reason"] is None


def test_graphed_segment_is_a_transparent_unregistered_seam_on_cpu():
    from libreyolo.graphs.training import GraphedSegment
    from libreyolo.models.registry import get_family
    m = get_family("rtdetr").new("r18", nc=3, device="cpu", seed=0)
    net = m.model.train()
    keys = list(net.state_dict())
    x = torch.rand(1, 3, 64, 64)
    torch.manual_seed(0)
    ref = net(x)["pred_logits"]
    seg = GraphedSegment(m.train_seam(net), name="front")
    m.set_train_seam(net, seg)
    assert list(net.state_dict()) == keys and not list(seg.parameters(recurse=False))
    torch.manual_seed(0)
    assert torch.equal(net(x)["pred_logits"], ref)     # CPU: the segment runs its module directly
    assert seg.info()["captures"] == 0
    m.set_train_seam(net, None)
    assert "front_override" not in net.__dict__


class _StaticGradGraphs:
    """Stands in for torch.cuda.make_graphed_callables on the CPU with its one property that
    matters here: the backward hands autograd *static* buffers (overwritten at every replay)."""

    def __call__(self, module, sample_args, **kwargs):
        params = [p for p in module.parameters() if p.requires_grad]
        static = [torch.zeros_like(p) for p in params]

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, *ps):
                ctx.save_for_backward(x)
                with torch.no_grad():
                    return module(x)

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                with torch.enable_grad():
                    out = module(x)
                    grads = torch.autograd.grad(out, params, g)
                for buf, gr in zip(static, grads):
                    buf.copy_(gr)
                return (None, *[buf.detach() for buf in static])

        return lambda x: Fn.apply(x, *params)


def test_graphed_segment_accumulates_micro_batches_like_eager(monkeypatch):
    """Two micro-batches through a graphed segment sum their gradients (no aliasing of the
    graph's static gradient buffers), equal to eager."""
    from libreyolo.graphs.training import GraphedSegment

    class CpuSegment(GraphedSegment):
        @staticmethod
        def _capturable(x):
            return True

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", _StaticGradGraphs())

    def run(graphed):
        torch.manual_seed(0)
        front, head = nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 1)
        seg = CpuSegment(front, repeat=1) if graphed else front
        for x in batches(2):
            head(seg(x[0])).pow(2).sum().backward()
        return [p.grad.clone() for p in front.parameters()], seg

    eager, _ = run(False)
    graphed, seg = run(True)
    assert seg.info()["captures"] == 1 and seg.info()["replays"] == 2
    for a, b in zip(eager, graphed):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fused", [None, True])
def test_primed_adamw_state_gives_the_lazy_first_steps_bit_for_bit(fused):
    # (capturable=True, what a captured whole step uses, needs CUDA tensors: the GPU suite covers it)
    """prime_optimizer_state makes AdamW's moments and step count before its first step (a
    captured whole step needs them allocated); the first steps equal an unprimed AdamW's."""
    from libreyolo.graphs.training import prime_optimizer_state

    def run(prime):
        torch.manual_seed(0)
        net = torch.nn.Linear(5, 3)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.05, fused=fused)
        if prime:
            prime_optimizer_state(opt)
            assert all(len(opt.state[p]) == 3 for p in net.parameters())
        for i in range(3):
            net(torch.full((4, 5), float(i + 1))).square().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        return [p.detach().clone() for p in net.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))


def test_flat_copy_round_trips_every_tensor_in_its_own_layout_and_dtype():
    """FlatCopy (the warm-up's save and restore): the values come back bit for bit into the very
    tensors, channels_last ones included, across dtypes, a dtype with a single tensor too (whose
    flattening alone would be a view, not a copy); ``changed_only`` (the capturer's BatchNorm
    restore) puts back the running statistics, which BatchNorm updates without moving their
    version counters, and leaves the unchanged buffers' counters alone."""
    from libreyolo.graphs.capture import FlatCopy, restore_buffers, snapshot_buffers
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn((2, 3, 4, 5), generator=g).contiguous(memory_format=torch.channels_last),
          torch.randn((7,), generator=g), torch.randn((3, 3), generator=g).half(),
          torch.arange(4), torch.zeros(0)]
    before = [t.clone() for t in ts]
    saved = FlatCopy(ts + ts[:2])   # a tensor listed twice is kept once
    assert len(saved) == len(ts)
    with torch.no_grad():
        for t in ts:
            t.add_(1) if t.is_floating_point() else t.mul_(3)
    assert not torch.equal(ts[0], before[0])
    saved.restore()
    assert all(torch.equal(t, b) and t.dtype == b.dtype for t, b in zip(ts, before))
    assert ts[0].is_contiguous(memory_format=torch.channels_last) and not ts[0].is_contiguous()
    # changed_only: BatchNorm's statistics after a warm-up pass, the other buffers untouched
    bn = nn.Sequential(nn.BatchNorm2d(3), nn.BatchNorm2d(3))
    bn[1].eval()
    stats = {k: v.clone() for k, v in bn.state_dict().items()}
    versions = {k: v._version for k, v in bn.state_dict().items()}
    snap = snapshot_buffers(bn)
    bn(torch.randn((2, 3, 4, 4), generator=g))
    assert not torch.equal(bn[0].running_mean, stats["0.running_mean"])
    restore_buffers(snap)
    assert all(torch.equal(v, stats[k]) for k, v in bn.state_dict().items())
    assert all(v._version == versions[k] for k, v in bn.state_dict().items() if k.startswith("1."))


def _backward_pair(channels_last: bool, with_grads: bool):
    """Two copies of one small conv net, two accumulated micro-batches each: one through
    ``loss.backward()``, one through ``backward_into_grads``."""
    from libreyolo.graphs.training import backward_into_grads
    g = torch.Generator().manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(), nn.Conv2d(8, 4, 1),
                        nn.Flatten(), nn.Linear(4 * 8 * 8, 5))
    unused = nn.Linear(2, 2)   # a parameter the loss does not reach keeps its gradient
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    nets = []
    for _ in range(2):
        n = nn.ModuleList([copy.deepcopy(net), copy.deepcopy(unused)]).to(memory_format=fmt)
        if with_grads:
            for p in n.parameters():
                p.grad = torch.full_like(p, 0.25)
        nets.append(n)
    xs = [torch.randn(4, 3, 8, 8, generator=g).contiguous(memory_format=fmt) for _ in range(2)]
    for x in xs:
        nets[0][0](x).square().mean().backward()
        params = list(nets[1].parameters())
        backward_into_grads(nets[1][0](x).square().mean(), params)
    return nets


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("with_grads", [False, True])
def test_backward_into_grads_is_backward_bit_for_bit(channels_last, with_grads):
    ref, got = _backward_pair(channels_last, with_grads)
    for (name, a), b in zip(ref.named_parameters(), got.parameters()):
        if a.grad is None:
            assert b.grad is None, name
            continue
        assert torch.equal(a.grad, b.grad), name
        assert a.grad.stride() == b.grad.stride(), name   # the parameter's layout, as backward keeps it
        assert b.grad.data_ptr() != 0 and b.grad._base is None, name   # its own memory, no alias
    assert (ref[1].weight.grad is None) == (not with_grads)


def test_backward_into_grads_adds_with_one_foreach_call(monkeypatch):
    from libreyolo.graphs.training import backward_into_grads
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    calls = []
    real = torch._foreach_add_
    monkeypatch.setattr(torch, "_foreach_add_", lambda a, b: calls.append(len(a)) or real(a, b))
    backward_into_grads(net(torch.ones(3, 4)).sum(), list(net.parameters()))
    assert calls == [4]
