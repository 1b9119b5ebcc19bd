"""A DataLoader worker killed while it holds its iterator's "workers done" lock must not hang the
trainer's shutdown of the loaders (engine/loaders.py: close_loaders, unjam_after_death)."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading

import torch
from torch.utils.data import DataLoader

from libreyolo.engine.loaders import close_loaders


def _die_holding(event) -> None:
    event._cond.acquire()          # what a worker does inside done_event.is_set() ...
    os.kill(os.getpid(), signal.SIGKILL)   # ... killed there: the lock stays taken


def test_a_worker_killed_holding_the_done_events_lock_does_not_hang_the_shutdown():
    holder = {"loader": DataLoader(torch.arange(64), batch_size=2, num_workers=2, persistent_workers=True)}
    holder["it"] = iter(holder["loader"])
    next(holder["it"])
    it = holder["it"]
    jam = multiprocessing.get_context("fork").Process(target=_die_holding, args=(it._workers_done_event,))
    jam.start()
    jam.join()
    assert not it._workers_done_event._cond.acquire(timeout=0.2)   # the lock is held by a dead process
    previous = signal.getsignal(signal.SIGCHLD)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # torch's handler would raise the death here
    try:
        os.kill(it._workers[0].pid, signal.SIGKILL)
        it._workers[0].join(timeout=10)
        del it
        done = threading.Event()

        def shut() -> None:
            close_loaders(holder.clear, after_death=True)
            done.set()

        t = threading.Thread(target=shut, daemon=True)
        t.start()
        t.join(timeout=60)
        assert done.is_set(), "the loader's shutdown hung on the dead worker's lock"
    finally:
        signal.signal(signal.SIGCHLD, previous)
