"""A CUDA-graph capturer that works on the CPU, for testing the graph policy without a GPU.

``StandInCapturer().capture(fn, inputs)`` keeps ``fn`` and static copies of the inputs; the
returned graph's ``replay`` copies new inputs into them and calls ``fn`` - the runner's
bookkeeping (signatures, captures, replays, stale checks) runs as it does with CUDA graphs.
``on_replay`` (a callable taking "replay" / "end") lets a test see where work runs.
"""
from __future__ import annotations


class StandInGraph:
    """Replays the function it was "captured" from, on static copies of the inputs."""

    def __init__(self, fn, inputs, on_replay=None):
        self.fn, self.static_inputs = fn, tuple(x.clone() for x in inputs)
        self.capture_ms, self.pool_bytes, self.replays = 1.0, 0, 0
        self.on_replay = on_replay

    def replay(self, inputs, clone=True, constant=()):
        for d, s in zip(self.static_inputs, inputs):
            d.copy_(s)
        self.replays += 1
        if self.on_replay is not None:
            self.on_replay("replay")
        out = self.fn(*self.static_inputs)
        if self.on_replay is not None:
            self.on_replay("end")
        return out


class StandInCapturer:
    """Records each capture's input shapes in ``captures``; ``fail=True`` raises as a capture
    invalidated by an illegal call would."""

    def __init__(self, fail: bool = False, on_replay=None):
        self.captures: list[tuple] = []
        self.fail = fail
        self.on_replay = on_replay

    @staticmethod
    def can_capture(device):
        return True

    def capture(self, fn, inputs, module=None):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures.append(tuple(tuple(x.shape) for x in inputs))
        return StandInGraph(fn, inputs, self.on_replay)
