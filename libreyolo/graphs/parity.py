"""The verification protocol shared by the GPU tests and ``libreyolo verify``.

Eager is the truth. For a function ``fn`` and two probes drawn from different
distributions: (1) the two eager outputs must differ (else the probes prove nothing),
(2) a graph captured on probe A and replayed on A and on B must equal eager on each,
bit for bit (``torch.equal`` on every output tensor), and (3) the replay of A must not
equal eager of B (the graph really reads its input: no stale result).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .capture import CudaGraphCapturer


def _leaves(out: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def clone_outputs(out: Any) -> list[torch.Tensor]:
    return [t.detach().clone() for t in _leaves(out)]


def all_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    diffs = [(x.double() - y.double()).abs().max().item() for x, y in zip(a, b) if x.numel() and x.shape == y.shape]
    return max(diffs, default=0.0)


@dataclass
class ParityResult:
    name: str
    outputs: int
    probes_differ: bool
    replay_a_equal: bool
    replay_b_equal: bool
    not_stale: bool
    max_abs_diff: float
    capture_ms: float
    error: str | None = None

    @property
    def passed(self) -> bool:
        return (self.error is None and self.probes_differ and self.replay_a_equal
                and self.replay_b_equal and self.not_stale)

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def check_parity(name: str, fn: Callable[..., Any], probe_a: tuple[torch.Tensor, ...],
                 probe_b: tuple[torch.Tensor, ...], module: torch.nn.Module | None = None) -> ParityResult:
    """Run the protocol for ``fn`` on two probes; never raises for a failed check."""
    try:
        eager_a = clone_outputs(fn(*probe_a))
        eager_b = clone_outputs(fn(*probe_b))
        graph = CudaGraphCapturer().capture(fn, probe_a, module=module)
        replay_a = clone_outputs(graph.replay(probe_a, clone=False))
        replay_b = clone_outputs(graph.replay(probe_b, clone=False))
        again_a = clone_outputs(graph.replay(probe_a, clone=False))
        torch.cuda.synchronize()
    except Exception as exc:  # reported, not raised: verify prints a verdict per case
        return ParityResult(name, 0, False, False, False, False, float("nan"), 0.0,
                            error=f"{type(exc).__name__}: {exc}")
    return ParityResult(
        name=name,
        outputs=len(eager_a),
        probes_differ=not all_equal(eager_a, eager_b),
        replay_a_equal=all_equal(replay_a, eager_a) and all_equal(again_a, eager_a),
        replay_b_equal=all_equal(replay_b, eager_b),
        not_stale=not all_equal(again_a, eager_b) and not all_equal(replay_b, eager_a),
        max_abs_diff=max(max_abs_diff(replay_a, eager_a), max_abs_diff(replay_b, eager_b)),
        capture_ms=graph.capture_ms,
    )
