"""The graph runner's policy, driven on the CPU through a stand-in capturer."""
import logging
import threading

import pytest
import torch
from standin import StandInCapturer, StandInGraph
from torch import nn

from libreyolo.graphs.runner import GraphRunner, GraphUnavailableError, normalize_mode


def make(supported=True, **kw):
    net = nn.Linear(4, 3)
    cap = kw.pop("capturer", None) or StandInCapturer()
    return net, cap, GraphRunner(net, "toy", supported, capturer=cap, **kw)


def test_modes_parse():
    assert normalize_mode("auto") == "auto" and normalize_mode("true") is True
    assert normalize_mode(None) is False and normalize_mode(0) is False
    with pytest.raises(ValueError, match="cuda_graph"):
        normalize_mode("sometimes")


def test_false_is_always_eager():
    net, cap, r = make()
    x = torch.randn(2, 4)
    for _ in range(3):
        assert torch.equal(r("s", net, (x,), mode=False), net(x))
    assert cap.captures == [] and r.info()["eager_calls"] == 3


def test_true_captures_on_first_use_and_replays_after():
    net, cap, r = make()
    x = torch.randn(2, 4)
    out = r("s", net, (x,), mode=True)
    assert torch.equal(out, net(x)) and len(cap.captures) == 1
    y = torch.randn(2, 4)
    assert torch.equal(r("s", net, (y,), mode=True), net(y))
    info = r.info()
    assert info["captures"] == 1 and info["graphs"][0]["replays"] == 2


def test_auto_captures_only_once_a_signature_repeats():
    net, cap, r = make()
    r("s", net, (torch.randn(1, 4),), mode="auto")
    assert cap.captures == []
    r("s", net, (torch.randn(1, 4),), mode="auto")
    assert cap.captures == [((1, 4),)]
    r("s", net, (torch.randn(5, 4),), mode="auto")  # new signature: eager again
    assert len(cap.captures) == 1


def test_signature_includes_dtype_grad_mode_autocast_and_key():
    net, cap, r = make()
    x = torch.randn(1, 4)
    r("a", net, (x,), mode=True)
    r("b", net, (x,), mode=True)
    r("a", lambda t: net(t.float()), (x.double(),), mode=True)
    with torch.no_grad():
        r("a", net, (x,), mode=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r("a", net, (x,), mode=True)
    assert len(cap.captures) == 5
    r("a", net, (x,), mode=True)
    assert len(cap.captures) == 5


def test_unsupported_family_true_raises_naming_it_auto_runs_eager():
    net, cap, r = make(supported=False)
    x = torch.randn(1, 4)
    with pytest.raises(NotImplementedError, match="'toy'"):
        r("s", net, (x,), mode=True)
    assert torch.equal(r("s", net, (x,), mode="auto"), net(x))
    info = r.info()
    assert not info["supported"] and "toy" in info["fallbacks"][0]["reason"] and cap.captures == []


def test_real_capturer_on_cpu_true_raises_auto_says_why():
    net = nn.Linear(4, 3)
    r = GraphRunner(net, "toy", True)
    x = torch.randn(1, 4)
    with pytest.raises(GraphUnavailableError, match="CUDA"):
        r("s", net, (x,), mode=True)
    for _ in range(3):
        assert torch.equal(r("s", net, (x,), mode="auto"), net(x))
    reasons = [f["reason"] for f in r.info()["fallbacks"]]
    assert len(reasons) == 1 and "cpu" in reasons[0] and r.info()["fallbacks"][0]["count"] == 3


@pytest.mark.parametrize("change", ["load_weights", "replace_param", "dtype", "new_module"])
def test_parameter_changes_release_stale_graphs(change):
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    cap = StandInCapturer()
    r = GraphRunner(net, "toy", True, capturer=cap)
    x = torch.randn(2, 4)
    r("s", net, (x,), mode=True)
    assert len(r.info()["graphs"]) == 1
    with torch.no_grad():
        if change == "load_weights":
            net.load_state_dict({k: v + 1 for k, v in net.state_dict().items()})
        elif change == "replace_param":
            net[0].weight = nn.Parameter(torch.zeros(4, 4))
        elif change == "dtype":
            net.double()
            x = x.double()
        else:
            net.append(nn.Linear(4, 4))
    out = r("s", net, (x,), mode=True)
    assert torch.equal(out, net(x)), "a stale graph was replayed"
    assert r.info()["invalidations"] == 1 and len(cap.captures) == 2


def test_lru_cap_evicts_oldest_and_warns_once_on_thrash(caplog):
    net, cap, r = make(max_graphs=2)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        for n in (1, 2, 3, 1, 2, 3):
            r("s", net, (torch.randn(n, 4),), mode=True)
    info = r.info()
    assert len(info["graphs"]) == 2 and info["evictions"] == 4
    assert [g["inputs"][0].split(":")[0] for g in info["graphs"]] == ["(2, 4)", "(3, 4)"]
    assert sum("thrashing" in m for m in caplog.messages) == 1


def test_lru_hit_refreshes_recency():
    net, cap, r = make(max_graphs=2)
    a, b, c = torch.randn(1, 4), torch.randn(2, 4), torch.randn(3, 4)
    r("s", net, (a,), mode=True)
    r("s", net, (b,), mode=True)
    r("s", net, (a,), mode=True)  # a is now most recent
    r("s", net, (c,), mode=True)  # evicts b
    assert [g["inputs"][0].split(":")[0] for g in r.info()["graphs"]] == ["(1, 4)", "(3, 4)"]


def test_capture_failure_true_raises_auto_falls_back_once():
    net, cap, r = make(capturer=StandInCapturer(fail=True))
    x = torch.randn(1, 4)
    with pytest.raises(RuntimeError, match="capturing"):
        r("s", net, (x,), mode=True)
    r2 = GraphRunner(net, "toy", True, capturer=StandInCapturer(fail=True))
    for _ in range(4):
        assert torch.equal(r2("s", net, (x,), mode="auto"), net(x))
    info = r2.info()
    assert len(info["failed_captures"]) == 1 and info["captures"] == 0


def test_release_and_explicit_capture():
    net, cap, r = make()
    d = r.capture("s", net, (torch.randn(3, 4),))
    assert d["stage"] == "s" and d["capture_ms"] == 1.0
    assert r.has_graph("s", (torch.randn(3, 4),))
    assert r.release() == 1 and r.info()["graphs"] == []


def test_a_callers_signature_finds_the_same_graph():
    """run_batch computes the signature once and hands it to has_graph and the call: the same
    graph is found and replayed as with the runner's own."""
    net, cap, r = make()
    x = torch.randn(3, 4)
    sig = r.signature("s", (x,))
    assert not r.has_graph("s", (x,), sig)
    r("s", net, (x,), mode=True, sig=sig)
    y = torch.randn(3, 4)
    assert r.has_graph("s", (y,), r.signature("s", (y,))) and r.has_graph("s", (y,))
    assert torch.equal(r("s", net, (y,), mode=True, sig=r.signature("s", (y,))), net(y))
    assert len(cap.captures) == 1 and r.info()["replays"] == 2   # the capture's own call replays too


def test_concurrent_calls_are_serialized_and_correct():
    net, cap, r = make()
    xs = [torch.randn(2, 4) for _ in range(8)]
    expected = [net(x) for x in xs]
    got = [None] * 8

    def work(i):
        for _ in range(50):
            got[i] = r("s", net, (xs[i],), mode=True)
            assert torch.equal(got[i], expected[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    assert len(cap.captures) == 1


class BufferTouchingCapturer(StandInCapturer):
    """Like the real capturer, warm-up writes into buffers (version counters move)."""

    def capture(self, fn, inputs, module=None):
        with torch.no_grad():
            for b in module.buffers():
                b.copy_(b)
        return super().capture(fn, inputs, module)


def test_capture_touching_buffers_does_not_invalidate_itself():
    net = nn.BatchNorm1d(4).eval()
    cap = BufferTouchingCapturer()
    r = GraphRunner(net, "toy", True, capturer=cap)
    x = torch.randn(3, 4)
    for _ in range(5):
        r("s", net, (x,), mode=True)
    info = r.info()
    assert info["captures"] == 1 and info["invalidations"] == 0 and info["graphs"][0]["replays"] == 5


def test_cached_graph_is_launched_before_the_stale_check():
    """A replay is launched first and the parameter check runs while the device works; a change
    found after the launch drops that replay's output, releases and runs the stage again."""
    net, cap, r = make()
    x = torch.randn(2, 4)
    r("s", net, (x,), mode=True)
    order = []
    fingerprint, replay = r.fingerprint, StandInGraph.replay
    r.fingerprint = lambda: order.append("check") or fingerprint()
    graph = r._graphs[next(iter(r._graphs))].graph
    graph.replay = lambda inputs, clone=True, **kw: order.append("replay") or replay(graph, inputs, clone, **kw)
    r("s", net, (x,), mode=True)
    assert order == ["replay", "check"], order
    with torch.no_grad():
        net.weight = nn.Parameter(torch.zeros(3, 4))
    out = r("s", net, (x,), mode=True)
    assert torch.equal(out, net(x)) and r.info()["invalidations"] == 1 and len(cap.captures) == 2


def test_a_graph_holds_the_storages_it_was_captured_with():
    """Until the stale check runs, a graph may still be replayed against its old weights: it keeps
    their storages alive so that such a replay reads memory that is still allocated."""
    net, cap, r = make()
    r("s", net, (torch.randn(2, 4),), mode=True)
    old = net.weight.untyped_storage().data_ptr()
    net.double()
    held = [st.data_ptr() for st in r._graphs[next(iter(r._graphs))].held]
    assert old in held and net.weight.untyped_storage().data_ptr() not in held
    r("s", net, (torch.randn(2, 4, dtype=torch.float64),), mode=True)
    assert all(old not in [st.data_ptr() for st in e.held] for e in r._graphs.values())


class RecomputingGraph:
    """Stands in for torch.cuda.CUDAGraph: a replay recomputes the static output from the static inputs."""

    def __init__(self, fn, static_inputs, static_output):
        self.fn, self.static_inputs, self.static_output = fn, static_inputs, static_output

    def replay(self):
        self.static_output.copy_(self.fn(*self.static_inputs))


def captured(fn, inputs, writes_inputs):
    from libreyolo.graphs.capture import CapturedGraph
    static = tuple(x.clone() for x in inputs)
    out = fn(*static)
    return CapturedGraph(RecomputingGraph(fn, static, out), static, out, 0.0, writes_inputs=writes_inputs)


def test_constant_input_is_copied_again_only_when_it_may_have_changed():
    """A constant input is skipped only when it is the very tensor copied last time, at the same
    version; other inputs, and every input of a graph that writes its inputs, are always copied."""
    def fn(x, t):
        return x * t[0] + t[1]
    x, t = torch.randn(5), torch.tensor([2.0, 1.0])
    g = captured(fn, (x, t), writes_inputs=False)
    g.replay((x, t), constant=(1,))
    sentinel = torch.tensor([-7.0, -7.0])
    g.static_inputs[0].fill_(99.0)
    g.static_inputs[1].copy_(sentinel)   # a skipped copy leaves the sentinel in place
    g.replay((x, t), constant=(1,))
    assert torch.equal(g.static_inputs[1], sentinel) and torch.equal(g.static_inputs[0], x)
    t.mul_(1.0)                           # in place: a new version, copied again
    assert torch.equal(g.replay((x, t), constant=(1,)), fn(x, t))
    g.static_inputs[1].copy_(sentinel)
    twin = t.clone()                      # equal values, another tensor: copied
    assert torch.equal(g.replay((x, twin), constant=(1,)), fn(x, t))
    g.static_inputs[1].copy_(sentinel)
    assert torch.equal(g.replay((x, t), constant=()), fn(x, t))  # not declared constant: copied
    w = captured(fn, (x, t), writes_inputs=True)
    w.replay((x, t), constant=(1,))
    w.static_inputs[1].copy_(sentinel)
    assert torch.equal(w.replay((x, t), constant=(1,)), fn(x, t))


def test_host_outputs_eager_and_replayed():
    """host=True hands back a HostCopy whose wait() gives the stage's outputs in host memory."""
    from libreyolo.graphs.capture import HostCopy
    net, cap, r = make()
    x = torch.randn(2, 4)
    for mode in (False, True, True):
        out = r("s", net, (x,), mode=mode, host=True)
        assert isinstance(out, HostCopy)
        got = out.wait()
        assert got.device.type == "cpu" and torch.equal(got, net(x)) and out.wait() is got


def test_graph_cache_policy_repeat_lru_and_clear():
    from libreyolo.graphs.cache import GraphCache

    evicted = []
    c = GraphCache(2, repeat=3, on_evict=evicted.append)
    assert [c.note("a") for _ in range(4)] == [False, False, True, True]
    c.insert("a", 1)
    c.insert("b", 2)
    assert c.get("a") == 1          # a is now the most recently used
    c.insert("c", 3)                # so b goes
    assert list(c) == ["a", "c"] and evicted == [1] and c.evictions == 1
    assert c.clear() == 2 and len(c) == 0 and not c.note("a")  # counts are forgotten too
    with pytest.raises(ValueError, match="max_graphs"):
        GraphCache(0)


def test_every_runner_keys_graphs_by_the_one_signature():
    """Inference runner, training-step runner and graphed segment share one signature function:
    shape, dtype, device, autocast and grad mode all separate graphs."""
    from libreyolo.graphs import runner as inference
    from libreyolo.graphs import training
    from libreyolo.graphs.cache import signature

    assert inference.signature is signature and training.signature is signature
    x = torch.zeros(2, 3)
    with torch.no_grad():
        no_grad = signature("k", (x,))
    assert no_grad != signature("k", (x,))
    assert signature("k", (x,)) != signature("k", (x.double(),)) != signature("k", (torch.zeros(3, 3),))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert signature("k", (x,)) != signature("j", (x,))
        ac = signature("k", (x,))
    assert ac != signature("k", (x,))
