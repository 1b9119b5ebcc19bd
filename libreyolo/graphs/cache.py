"""The one graph-cache policy every runner uses: signatures, repeat counts, a bounded LRU.

Inference (:class:`~libreyolo.graphs.runner.GraphRunner`), the training step
(:class:`~libreyolo.graphs.training.TrainStepRunner`) and a graphed training segment
(:class:`~libreyolo.graphs.training.GraphedSegment`) all decide the same three things: which
inputs may share a graph (:func:`signature`), when a signature has been seen often enough to be
worth a capture (:meth:`GraphCache.note`), and which graph to drop when too many are kept
(:meth:`GraphCache.insert`, least recently used first). They differ only in the numbers
(``repeat``, ``max_graphs``) and in what they store per signature.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import torch

from .capture import autocast_state


def signature(key: Hashable, inputs: Sequence[torch.Tensor]) -> tuple:
    """What a graph is keyed by: the caller's ``key`` (the stage, or whether the step is whole),
    every input's shape, dtype and device, the autocast state of the inputs' device type and the
    grad mode. Two calls with equal signatures can replay one graph."""
    dev = inputs[0].device.type if inputs else "cpu"
    return (key,
            tuple([(tuple(x.shape), x.dtype, x.device) for x in inputs]),
            autocast_state(dev if dev in ("cuda", "cpu") else "cuda"),
            torch.is_grad_enabled())


class GraphCache:
    """Graphs (or whatever a runner stores per signature) in least-recently-used order, at most
    ``max_graphs`` of them, with a count of how often each signature was asked for.

    ``repeat``: how many times a signature must have been seen before :meth:`note` says it may be
    captured (1: at once). ``on_evict(count)`` is called after each eviction with the total so far.
    ``recount_evicted``: an evicted signature must be seen ``repeat`` times again before its next
    capture (else once is enough).
    """

    def __init__(self, max_graphs: int, repeat: int = 1, on_evict: Callable[[int], None] | None = None,
                 recount_evicted: bool = False):
        if max_graphs < 1:
            raise ValueError("max_graphs must be >= 1")
        self.max_graphs = max_graphs
        self.repeat = max(1, int(repeat))
        self.on_evict = on_evict
        self.recount_evicted = recount_evicted
        self.evictions = 0
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self._seen: Counter = Counter()

    # ---------------------------------------------------------------- lookups
    def get(self, sig: tuple) -> Any | None:
        """The entry for ``sig``, marked most recently used; None if there is none."""
        entry = self._entries.get(sig)
        if entry is not None:
            self._entries.move_to_end(sig)
        return entry

    def note(self, sig: tuple) -> bool:
        """Count one more request for ``sig``; True once it has been seen ``repeat`` times."""
        self._seen[sig] += 1
        return self._seen[sig] >= self.repeat

    def insert(self, sig: tuple, entry: Any) -> Any:
        """Keep ``entry`` for ``sig``; the least recently used entries go beyond ``max_graphs``."""
        self._entries[sig] = entry
        self._entries.move_to_end(sig)
        while len(self._entries) > self.max_graphs:
            gone, _ = self._entries.popitem(last=False)
            if self.recount_evicted:
                self._seen.pop(gone, None)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(self.evictions)
        return entry

    def clear(self) -> int:
        """Forget every entry and every count; returns how many entries there were."""
        n = len(self._entries)
        self._entries.clear()
        self._seen.clear()
        return n

    # ---------------------------------------------------------- mapping view
    def __contains__(self, sig: object) -> bool:
        return sig in self._entries

    def __getitem__(self, sig: tuple) -> Any:
        return self._entries[sig]

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def items(self):
        return self._entries.items()

    def values(self):
        return self._entries.values()
