"""Work that leaves the training step's critical path: one job at a time in a thread.

The trainer writes its checkpoints and draws ``results.png`` through a :class:`BackgroundJob`:
``submit`` waits for the previous job (so jobs never overlap and a file is never written by two
threads), then starts the new one in a daemon thread and returns; ``wait`` joins it. An exception
raised by a job is kept and raised by the next ``submit`` or ``wait`` in the caller's thread - the
original exception, with a note naming the job - so a failed write stops the run as a
synchronous one would, one epoch later at most.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)


class BackgroundJob:
    """Runs one callable at a time in a thread of its own (see the module docstring)."""

    def __init__(self, name: str):
        self.name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._what = ""

    def busy(self) -> bool:
        """Whether a job is still running."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, fn: Callable[..., Any], *args: Any, what: str = "") -> None:
        """Wait for the previous job (raising its error, if it failed), then run ``fn(*args)`` in
        a new thread. ``what`` names the job in the note of its error."""
        self.wait()
        self._what = what or getattr(fn, "__name__", "job")

        def run() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # kept for the caller's thread: raised by wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"libreyolo-{self.name}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Join the running job; raise the error of a job that failed (once)."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        if self._error is not None:
            exc, self._error = self._error, None
            exc.add_note(f"(raised in the background by libreyolo's {self.name}: {self._what})")
            raise exc

    def close(self, raising: bool = True) -> BaseException | None:
        """Join the running job. With ``raising=False`` an error is returned instead of raised
        (for a caller that is already handling another exception)."""
        try:
            self.wait()
        except BaseException as exc:
            if raising:
                raise
            return exc
        return None


_frozen = 0
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[None]:
    """The objects alive at entry leave the garbage collector's view for the block
    (``gc.freeze()``), and come back at its exit (``gc.unfreeze()``, once the last of
    overlapping blocks ends).

    A training process holds a few hundred thousand long-lived objects (torch, the datasets'
    lists, the model); every full collection walks all of them (docs/benchmarks.md, "Training
    run levers"), and a run's allocations trigger such collections every few epochs, in the step
    loop's critical path. Frozen, a full collection walks only what the run created. Objects are still
    freed by their reference counts; only reference cycles among the frozen ones wait for the
    exit to be collected."""
    global _frozen
    if not enabled:
        yield
        return
    with _frozen_lock:
        gc.freeze()
        _frozen += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen -= 1
            if _frozen == 0:
                gc.unfreeze()
