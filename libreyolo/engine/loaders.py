"""The training data's loaders: how many DataLoader workers (:func:`default_workers`,
:func:`cap_workers`), what each worker does first (:func:`loader_worker_init`), the training set
re-seeded per epoch in the workers (:class:`EpochSeeded`), and torch's report of a dead worker
(:func:`worker_died`, :class:`WorkerDeathSignal`).
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..device import available_cores

log = logging.getLogger(__name__)


def default_workers(device: torch.device) -> int:
    """DataLoader workers when ``workers`` is not given: on CUDA as many as keep a graphed step fed
    (up to 8, one core left for the main process); on the CPU at most 2, since workers there
    compete with the training arithmetic for the same cores."""
    cores = available_cores()
    return max(1, min(8 if device.type == "cuda" else 2, cores - 1)) if cores > 1 else 0


#: what one DataLoader worker is assumed to cost in memory (a forked copy of the training
#: process's touched pages, its prefetched batches): the workers are capped at MemAvailable / this
WORKER_BYTES = 512 * 2**20


def _mem_available() -> int | None:
    """The memory the kernel can give without swapping (``/proc/meminfo`` MemAvailable, bytes);
    None where it cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cap_workers(requested: int, batches: int, ranks: int = 1) -> tuple[int, list[str]]:
    """``requested`` DataLoader workers capped at what can be used: the CPU cores of this process
    (shared by the ``ranks`` processes of a distributed run on this machine), the loader's batches
    per epoch (a worker loads whole batches: more would wait idle) and the available memory
    (:data:`WORKER_BYTES` each). Returns the count and the reasons of the caps that applied."""
    n, why = requested, []
    cores = max(1, available_cores() // max(1, ranks))
    if n > cores:
        n = cores
        why.append(f"{cores} CPU core{'s' if cores > 1 else ''} available" + (" per rank" if ranks > 1 else ""))
    if n > batches:
        n = batches
        why.append(f"{batches} batch{'es' if batches != 1 else ''} per epoch")
    mem = _mem_available()
    if mem is not None and n > mem // (WORKER_BYTES * max(1, ranks)):
        n = int(mem // (WORKER_BYTES * max(1, ranks)))
        why.append(f"{mem / 2**30:.1f} GiB of memory available, about {WORKER_BYTES / 2**30:.1f} GiB per worker")
    return max(0, n), why


def loader_worker_init(parent: int, worker_id: int) -> None:
    """Every DataLoader worker's first call (``worker_init_fn``, bound to the training process's
    pid): on Linux the worker asks to be killed when its parent dies (``PR_SET_PDEATHSIG``:
    torch's workers notice a dead parent only between batches, every 5 s; one killed with
    SIGKILL, or the out-of-memory killer's victim, would otherwise leave them running) and exits
    at once if the parent is already gone (the kernel's "parent" is the thread that started the
    worker: the trainer's, alive for the run). Ctrl-C, which reaches the whole process group, is
    ignored: the training process stops the workers itself, after the write in flight."""
    import signal
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)   # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:   # the parent died before the request took effect
        os._exit(1)


class EpochSeeded(torch.utils.data.Dataset):
    """The training set as the loader sees it: in a worker process, the augmentation RNGs (torch,
    numpy, random) are re-seeded from (seed, epoch, worker id) at the first sample of each epoch.

    Persistent workers live across epochs, so without this their random streams would continue
    from the previous epoch and a resumed run would augment differently from an uninterrupted
    one; with it, epoch e draws the same in both (as non-persistent workers, seeded per epoch by
    the loader's re-seeded generator, did). Without workers, the main process's RNGs are the
    trainer's, re-seeded per epoch there. The epoch lives in shared memory, so running workers see
    it."""

    def __init__(self, dataset, seed: int, rank: int = 0):
        self.dataset = dataset
        self.seed = int(seed)
        self.rank = int(rank)   # a distributed run's rank: its workers draw their own streams
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._seen = -1   # per process: the epoch this process's RNGs were seeded for

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        info = torch.utils.data.get_worker_info()
        if info is not None:
            epoch = int(self._epoch[0])
            if epoch != self._seen:
                import random
                key = [self.seed, epoch, info.id] + ([self.rank] if self.rank else [])
                seed = int(np.random.SeedSequence(key).generate_state(1)[0])
                torch.manual_seed(seed)
                np.random.seed(seed)
                random.seed(seed)
                self._seen = epoch
        return self.dataset[index]


def start_method() -> str:
    """How DataLoader workers start here: the start method set for this process, else the
    platform's default (the first of ``get_all_start_methods``); reading it sets nothing."""
    import multiprocessing
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def worker_died(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's report of a DataLoader worker process that died (killed by a
    signal - often the out-of-memory killer - or exited), not an error raised by the dataset."""
    return isinstance(exc, RuntimeError) and "DataLoader worker (pid" in str(exc)


class WorkerDeathSignal:
    """torch's SIGCHLD handler (it raises a dead DataLoader worker's error at whatever bytecode the
    main thread is at), reporting the first death only. After that the run is stopping; a second
    report could land anywhere: in the except clause that handles the first, or inside an
    iterator's ``__del__`` between its workers' join and the removal of their pids, where Python
    only prints it and the pids stay registered (every later child exit of the process, a
    subprocess's too, would raise the dead worker's error again). Installed over torch's handler
    once a loader iterator with workers exists (torch sets its own then, once per process), and
    put back when the run ends; only from the main thread, the one Python runs handlers in."""

    def __init__(self):
        self.inner = None    # the handler this one wraps (torch's)
        self.quiet = False   # set by the first report: the later ones are dropped

    @staticmethod
    def _settable() -> bool:
        import signal
        import threading
        return hasattr(signal, "SIGCHLD") and threading.current_thread() is threading.main_thread()

    def install(self) -> None:
        import signal
        if self.inner is None and self._settable():
            current = signal.getsignal(signal.SIGCHLD)
            if callable(current) and current is not self:
                self.inner = current
                signal.signal(signal.SIGCHLD, self)

    def __call__(self, signum, frame) -> None:
        if self.quiet:
            return
        try:
            self.inner(signum, frame)
        except RuntimeError as exc:
            if worker_died(exc):
                self.quiet = True
            raise

    def uninstall(self) -> None:
        import signal
        if self.inner is not None and self._settable() and signal.getsignal(signal.SIGCHLD) is self:
            signal.signal(signal.SIGCHLD, self.inner)
            self.inner = None
        self.quiet = False   # where another handler wraps this one, it reports again as torch's


@dataclass
class Loaders:
    """A run's data as :func:`build_loaders` made it: the training loader (over
    :class:`EpochSeeded`, shuffled by ``generator``, re-seeded per epoch; a distributed run's
    ``sampler`` deals the ranks their shares) and the validation loader (in order, the global batch)."""

    train: torch.utils.data.DataLoader | None   # None: built for validation alone (model.val)
    val: torch.utils.data.DataLoader
    train_set: Any
    val_set: Any
    epoch_seeded: EpochSeeded
    sampler: Any                  # the DistributedSampler of a distributed run, else None
    generator: torch.Generator    # the training loader's shuffle generator
    cap_note: str | None          # the workers capped, and why (None: as requested)
    started: bool = False         # a persistent loader draws its workers' base seed once, when it starts

    def epoch_batches(self, epoch: int, task, cfg) -> tuple:
        """Epoch ``epoch``'s batch iterator and the task's data phase change (None: none). First
        what its batches depend on: the task's data phase (``Task.on_epoch``: close_mosaic writes
        the shared memory the workers read), the shuffle generator re-seeded (seed + epoch), the
        workers' seed epoch (:class:`EpochSeeded`), the distributed sampler's epoch. With
        persistent workers ``iter()`` sets them to work on the epoch's first batches at once."""
        why = task.on_epoch(self.train_set, epoch, cfg.run.epochs, cfg.task)
        self.generator.manual_seed(cfg.run.seed + epoch)
        if self.train.persistent_workers and self.started:
            # a loader draws its workers' base seed from the generator before the shuffle, and a
            # persistent one only when it starts: the same draw here keeps every epoch's order the
            # one a freshly started loader gives (so a resumed run shuffles as an uninterrupted one)
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        self.started = True
        self.epoch_seeded.set_epoch(epoch)
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
        return iter(self.train), why


def build_loaders(task, data, model, cfg, device: torch.device, dist=None, val_only: bool = False) -> Loaders:
    """The training and validation loaders of ``data`` (a resolved dataset) for ``model`` under
    ``cfg`` (a :class:`~libreyolo.engine.config.TrainConfig`): the task's datasets, the worker
    count (:func:`cap_workers`), the image cache filled before the workers start (forked workers
    share it), persistent workers that die with this process (:func:`loader_worker_init`).
    ``val_only`` (``model.val``): the training split is not opened (``Task.val_dataset``), cached
    or given a loader (``Loaders.train`` and ``Loaders.train_set`` are None)."""
    if val_only:   # the training split is not even opened (its labels not parsed)
        train_set = None
        val_set, collate = task.val_dataset(data, cfg.run.imgsz, model, cfg.task)
    else:
        train_set, val_set, collate = task.datasets(data, cfg.run.imgsz, model, cfg.task)
    requested = default_workers(device) if cfg.run.workers is None else int(cfg.run.workers)
    batch, d = cfg.run.batch, dist
    epoch_seeded = EpochSeeded(train_set, cfg.run.seed, d.rank if d is not None else 0)
    sampler = None
    n_train = len(train_set) if train_set is not None else 0
    if d is not None:   # each rank its batch/world share of every global batch, reshuffled per epoch
        batch = d.local_batch(batch)
        sampler = torch.utils.data.DistributedSampler(epoch_seeded, d.world, d.rank, shuffle=True, seed=cfg.run.seed)
        n_train = len(sampler)
    drop_last = n_train > batch
    train_batches = n_train // batch if drop_last else min(n_train, 1)
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) if d is not None else 1
    # no more workers than the machine and the dataset can use (workers=1000 on 8 images
    # once forked 1,000 processes and woke the out-of-memory killer); validation's loader
    # is capped by its own batches
    # (validation alone: only the validation loader's own cap below applies)
    workers, why = cap_workers(requested, requested if val_only else train_batches, ranks)
    cap_note = None   # logged by the trainer's set-up (a val() call builds the loaders too)
    if why:
        asked = f"workers={requested}" if cfg.run.workers is not None else f"the default {requested} workers"
        cap_note = f"{asked} capped at {workers}: {', '.join(why)}"
    val_workers, _ = cap_workers(workers, -(-len(val_set) // cfg.run.batch))
    mode = cfg.run.cache
    if mode == "auto" and workers > 0 and start_method() != "fork":
        # workers not forked (spawn, forkserver) would each receive a copy of a RAM cache
        log.info("cache=auto: no RAM cache, the DataLoader workers start by %s and would "
                 "each hold a copy (cache=ram caches anyway)", start_method())
        mode = False
    if mode:   # before the workers start: forked workers share a RAM cache
        for ds in (val_set,) if val_only else (train_set, val_set):
            fill = getattr(ds, "cache_images", None)
            if fill is None:
                if mode != "auto":
                    log.warning("cache=%s: the %s task's datasets have no image cache; they "
                                "read their files every epoch", mode, task.name)
                break
            fill(mode, progress=cfg.run.verbose)
    # One generator, re-seeded at every epoch (seed + epoch): the shuffle order and the
    # workers' augmentation seeds of epoch e are the same in a resumed run.
    generator = torch.Generator().manual_seed(cfg.run.seed)
    pin = device.type == "cuda"
    # persistent workers: no process start-up per epoch; EpochSeeded re-seeds them per epoch;
    # each worker dies with this process and leaves Ctrl-C to it (loader_worker_init)
    init = functools.partial(loader_worker_init, os.getpid())

    def common(n: int) -> dict:
        return dict(num_workers=n, pin_memory=pin, collate_fn=collate, persistent_workers=n > 0,
                    worker_init_fn=init if n > 0 else None)
    if val_only:
        train = None
    elif d is not None:
        train = torch.utils.data.DataLoader(epoch_seeded, batch_size=batch, sampler=sampler, generator=generator,
                                            drop_last=drop_last, **common(workers))
    else:
        train = torch.utils.data.DataLoader(epoch_seeded, batch_size=batch, shuffle=True, generator=generator,
                                            drop_last=drop_last, **common(workers))
    # validation runs on rank 0 alone, at the global batch (as one GPU validates)
    val = torch.utils.data.DataLoader(val_set, batch_size=cfg.run.batch, shuffle=False, **common(val_workers))
    return Loaders(train, val, train_set, val_set, epoch_seeded, sampler, generator, cap_note)


def close_loaders(drop: Callable[[], None], after_death: bool = False) -> None:
    """Stop a run's loaders' persistent worker processes (and pin-memory threads) now, when the
    run ends, instead of leaving them to the interpreter's exit: ``drop`` lets go of every
    reference to the loaders and their iterators (a prefetched epoch's, validation's), then they
    are collected. ``after_death``: one of the workers died, and torch's SIGCHLD check reports it
    again while the others are joined (inside the iterators' ``__del__``, where Python can only
    print it as an "Exception ignored" traceback); the run is already stopping with its own
    message, so those are not printed."""
    import gc
    previous = sys.unraisablehook

    def hook(unraisable):
        if not worker_died(unraisable.exc_value):
            previous(unraisable)

    if after_death:
        sys.unraisablehook = hook
        unjam_after_death()
    try:
        drop()
        gc.collect()
    finally:
        sys.unraisablehook = previous


def unjam_after_death() -> None:
    """Make the shutdown of a loader whose worker died unable to hang. A worker checks its
    iterator's "workers done" event (a ``multiprocessing.Event``: a lock in shared memory) between
    batches; killed while it held that lock (SIGKILL, the out-of-memory killer), it leaves the lock
    taken for good, and torch's shutdown (``_shutdown_workers``: ``set()`` on that event) waits
    forever. For each live multi-process iterator with a dead worker: its other workers are killed
    (the run is stopping; their batches are not wanted) and the event is replaced by a fresh one,
    which the shutdown then sets as usual. torch's private attributes, read defensively: an
    iterator without them is left as it is."""
    import gc
    import multiprocessing

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    # type(), not isinstance(): the latter reads __class__, which some lazy module proxies warn on
    for it in [o for o in gc.get_objects() if issubclass(type(o), _MultiProcessingDataLoaderIter)]:
        workers = getattr(it, "_workers", None)
        if getattr(it, "_shutdown", True) or not workers or all(w.is_alive() for w in workers):
            continue
        for w in workers:
            if w.is_alive():
                w.kill()
                w.join(timeout=5)
        if hasattr(it, "_workers_done_event"):
            it._workers_done_event = multiprocessing.Event()
