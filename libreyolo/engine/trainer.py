"""Task-generic training loop: the task supplies the data, the evaluator and the fitness; the
family supplies the network and the loss; ``graphs/`` captures the step.

:meth:`Trainer.train` is the loop: set-up (seeding, data, network, loss, optimizer, EMA, resume,
the graph decision), then per epoch :meth:`Trainer.train_epoch` - each batch one
:meth:`Trainer.step` - and around it the hooks (:mod:`libreyolo.engine.hooks`), in order: the
schedule (warm-up before each of its batches, the decay after each epoch), evaluation of the EMA
weights with early stopping, the logs (``results.csv``, the per-epoch line, ``results.png``,
TensorBoard: :mod:`libreyolo.engine.loggers`), checkpoints (``last.pt`` with the training state
for ``resume``, ``best.pt`` without it, both written atomically), a user's hooks, the time
accounting and the stop decision all ranks follow. The loop keeps the device busy: a step's loss
is read one step late (:class:`~libreyolo.engine.step.LossFold`, no host sync per step), and the
next epoch's loader is started before the end-of-epoch hooks (:meth:`Trainer._prepare_epoch`), so
its first batches load during validation. Features: SGD or AdamW with parameter groups (no decay
on norms and biases), warm-up then linear or cosine decay, gradient accumulation to a nominal
batch, an exponential moving average of the weights (updated in the step), AMP on CUDA.

With ``cuda_graph=True`` the step goes through :class:`libreyolo.graphs.training.TrainStepRunner`
(forward + loss + backward, and the whole step with the update where graph-safe) or, for families
with a seam, a :class:`~libreyolo.graphs.training.GraphedSegment`; anything that cannot be
captured logs one line and trains eager.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from ..distributed import Distributed, revert_sync_batchnorm
from ..tasks import Task
from .background import frozen_heap
from .config import TrainConfig
from .hooks import (
    CheckpointHook,
    EvaluationHook,
    HookBase,
    HookError,
    ScheduleHook,
    StopHook,
    TimingHook,
    as_hooks,
    timing_line,
)
from .loaders import WorkerDeathSignal, build_loaders, close_loaders, worker_died
from .loggers import EXPERIMENT_LOGGERS, LoggingHook, TensorBoardHook
from .outcome import load_best, run_outcome
from .runs import (
    RunFolder,
    RunFolderBusy,
    TrainingDiverged,
    TrainingError,
    TrainingInterrupted,
    interrupted_message,
    last_pt_kept,
)
from .setup import check_config, device_settings, set_up
from .step import LossFold

#: the errors that stop a run, importable from here (where users catch them)
__all__ = ["Trainer", "TrainConfig", "TrainingError", "TrainingDiverged", "RunFolderBusy", "TrainingInterrupted",
           "HookError", "timing_line"]

log = logging.getLogger(__name__)


class Trainer:
    """Trains ``model`` (a libreyolo Model) according to a :class:`TrainConfig`; ``hooks``: the
    user's (:class:`~libreyolo.engine.hooks.HookBase` objects or ``{event: fn}`` dicts), run after
    the built-in ones (see :meth:`register_hooks`)."""

    def __init__(self, model, cfg: TrainConfig, hooks=()):
        check_config(cfg, model.STRIDE)
        self.model = model
        self.task: Task = model.task_def
        self.cfg = cfg
        self.dist: Distributed | None = None   # joined in setup (train only): see libreyolo.distributed
        self.device, self.amp_dtype, self.channels_last = device_settings(model, cfg)
        self.model.to(self.device)
        self.amp = self.amp_dtype is not None
        self.memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        self.frozen_params: list[nn.Parameter] = []   # what freeze= turned off, on again after the run
        self.device_augment = None   # the task's per-batch augmentation on the device (gpu_augment), set up with the data
        self.epoch: int | None = None   # the epoch running (0-based); None before the first
        self.last_evaluation = None      # the latest validation's Evaluation (evaluation hook, rank 0)
        self.iter = 0                    # the global batch index of the step running
        self.run_folder = RunFolder()    # claimed in setup (rank 0)
        self.hooks: list[HookBase] = []
        # the run's accounting and the stop decision come last, after the user's hooks
        self._tail = [TimingHook(), StopHook()]
        builtin = [ScheduleHook(), EvaluationHook(), LoggingHook(), CheckpointHook()]
        if "tensorboard" in cfg.run.loggers:   # before the checkpoints, whose end may raise a write's error
            builtin.insert(3, TensorBoardHook())
        # the experiment trackers after the checkpoints and the plots, whose files they send at
        # the end (a missing package is an ImportError here, before any work)
        builtin += [EXPERIMENT_LOGGERS[name]() for name in cfg.run.loggers if name in EXPERIMENT_LOGGERS]
        self.register_hooks(builtin)
        self.register_hooks(hooks)

    def register_hooks(self, hooks) -> None:
        """Add hooks (:class:`~libreyolo.engine.hooks.HookBase` objects, or ``{event: fn}`` dicts
        of functions called with the trainer) after those registered before, ahead of the run's
        time accounting and stop decision (always last, so that a hook's ``stop_reason`` is seen)."""
        for hook in as_hooks(hooks):
            hook.trainer = self
            self.hooks.append(hook)
        for hook in self._tail:
            hook.trainer = self

    def _all_hooks(self) -> list[HookBase]:
        """The hooks this process runs, in order (a distributed run's other ranks skip rank 0's)."""
        main = self.dist is None or self.dist.is_main
        return [h for h in self.hooks + self._tail if main or not h.main_only]

    def _call(self, hook: HookBase, event: str) -> None:
        """``hook``'s ``event``; a user hook's exception becomes one :class:`HookError` naming it
        (a dead DataLoader worker, which torch raises wherever the main thread is, stays itself)."""
        try:
            getattr(hook, event)()
        except Exception as exc:
            if hook.own_errors or worker_died(exc) or (self.dist is not None and self.dist.failure(exc)):
                raise
            raise HookError(f"training stopped: the hook {hook.name} raised in {event}: "
                            f"{type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------ data
    def make_loaders(self, data):
        """The run's loaders (:func:`~libreyolo.engine.loaders.build_loaders`), their datasets and
        the per-epoch state the loop keeps for them."""
        ld = self.data = build_loaders(self.task, data, self.model, self.cfg, self.device, self.dist)
        self.train_set, self.val_set, self.epoch_seeded = ld.train_set, ld.val_set, ld.epoch_seeded
        self.worker_cap_note = ld.cap_note
        self._prepared = None   # (epoch, its loader iterator, the task's phase change): see _prepare_epoch
        self._worker_signal = WorkerDeathSignal()
        return ld.train, ld.val

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        """Seeds, data, network, loss, optimizer, EMA, resume state, run folder, step runner
        (:func:`~libreyolo.engine.setup.set_up`)."""
        set_up(self)

    # ------------------------------------------------------------------ loop
    def step(self, ni: int, batch) -> torch.Tensor:
        """One batch: forward, loss, backward and - once ``accumulate`` batches are in - the
        update, graphed where the runner can. Returns the loss items as float32 on the step's
        device, not waited for: reading them on the host is the caller's sync (train_epoch reads
        them one step late, through :class:`LossFold`)."""
        imgs, *targets = self.device_batch(batch)
        x = imgs.float().div_(255).contiguous(memory_format=self.memory_format)
        update_now = ni - self.last_opt_step >= self.accumulate
        runner = self.step_runner
        if self.whole_step and update_now and ni > self.nw:  # micro-batches replay the fwd+bwd graph
            _, items = runner(x, *targets, whole=True)  # update included
            self.last_opt_step = ni
        else:
            _, items = runner(x, *targets)
            if update_now:
                self.optimizer_step()
                self.last_opt_step = ni
        self.last_batch = (x, targets)
        return items.detach().float()

    def device_batch(self, batch) -> list[torch.Tensor]:
        """The step's batch: :meth:`batch_to_device`, and in a distributed run the targets padded
        to the largest row count of the ranks (a task whose target rows vary: detection). A rank
        meeting a new count would capture - its warm-up running collectives its peers, replaying,
        do not - while the others replay; with one count for all they capture together."""
        imgs, *targets = self.batch_to_device(batch)
        rows = self.task.target_rows(targets) if self.dist is not None else None
        if rows is not None:
            agreed = self.dist.max_int(rows)
            if agreed != rows:
                targets = self.task.pad_target_rows(targets, agreed)
        return [imgs, *targets]

    def batch_to_device(self, batch) -> list[torch.Tensor]:
        """A loader batch on the device; with the task's device augmentation (``gpu_augment``)
        augmented there, before the step and outside its captured graph."""
        batch = [t.to(self.device, non_blocking=True) for t in batch]
        if self.device_augment is not None:
            batch = list(self.device_augment(*batch))
        return batch

    def _prepare_epoch(self, epoch: int) -> None:
        """What epoch ``epoch``'s batches depend on, then its loader iterator: the task's data phase
        (``Task.on_epoch``: close_mosaic writes the shared memory the workers read), the shuffle
        generator re-seeded (seed + epoch), the workers' seed epoch (EpochSeeded), the distributed
        sampler's epoch. With persistent workers ``iter()`` sets them to work on the epoch's first
        batches at once (prefetch_factor per worker), so when this runs before the previous epoch's
        validation those batches load while it validates. The main process's RNGs are seeded in
        :meth:`train_epoch`, after validation, where the step (and a worker-less loader) draws them."""
        self._prepared = (epoch, *self.data.epoch_batches(epoch, self.task, self.cfg))
        self._worker_signal.install()   # torch's SIGCHLD handler is set by then (an iterator with workers)

    def _prefetch_validation(self) -> None:
        """``iter()`` of the validation loader now, for validation to consume: with persistent
        workers that sets them to work at once (prefetch_factor batches each). Only where this
        epoch's validation runs (rank 0, ``val`` on, a non-empty split) and the loader has workers."""
        self._val_batches = None
        loader = getattr(self, "val_loader", None)
        main = self.dist is None or self.dist.is_main
        if (self.cfg.tune.prefetch_validation and main and loader is not None and loader.num_workers > 0
                and self.cfg.run.val and len(self.val_set) > 0):
            self._val_batches = (loader, iter(loader))

    def prefetched_validation(self, loader) -> Any:
        """The iterator of ``loader`` started before the epoch's last step (:meth:`_prefetch_validation`),
        handed out once (a second ``iter()`` of a persistent loader would reset its workers' work);
        None where there is none for this loader."""
        prefetched, self._val_batches = getattr(self, "_val_batches", None), None
        return prefetched[1] if prefetched is not None and prefetched[0] is loader else None

    def _prepared_for(self, epoch: int) -> tuple:
        prepared = getattr(self, "_prepared", None)
        if prepared is None or prepared[0] != epoch:
            self._prepare_epoch(epoch)
        return self._prepared

    def train_epoch(self, epoch: int) -> torch.Tensor:
        """One epoch over the training set - per batch the hooks' ``before_step``, :meth:`step`,
        their ``after_step`` - then the gradients still accumulating applied; returns the mean
        loss items.

        The loop does not wait for the device: each step's items are read one step late
        (:class:`LossFold`), and the progress bar shows those and refreshes at tqdm's own rate."""
        cfg, nb = self.cfg, self.nb
        _, batches, _ = self._prepared_for(epoch)
        self._prepared = None
        seed = cfg.run.seed + epoch
        rank = self.dist.rank if self.dist is not None else 0
        if rank:   # other ranks augment from their own streams
            seed = int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        if self.device_augment is not None:
            self.device_augment.seed(cfg.run.seed, epoch, rank)
        self.net.train()
        for module in self.frozen_norms:   # frozen layers keep their normalization statistics
            module.eval()
        fold = LossFold(len(self.item_names), self.device, epoch)
        progress = None
        if cfg.run.verbose:
            from tqdm import tqdm
            progress = tqdm(total=nb, desc=f"epoch {epoch + 1}/{cfg.run.epochs}", unit="batch", leave=True)

        def postfix() -> None:   # the last folded batch's fields; drawn at tqdm's next refresh
            post = {n: f"{v:.3f}" for n, v in zip(self.item_names, fold.mloss.tolist())}
            post.update(fold.counts)
            progress.set_postfix(post, refresh=False)

        hooks = self._all_hooks()   # per step: only those that handle the event (nothing for the others)
        before = [h for h in hooks if h.handles("before_step")]
        after = [h for h in hooks if h.handles("after_step")]
        wait, t_ready = 0.0, time.perf_counter()
        try:
            for i, batch in enumerate(batches):
                wait += time.perf_counter() - t_ready   # the loop waited this long for the loader
                if i == nb - 1:
                    self._prefetch_validation()
                ni = self.iter = i + nb * epoch
                for hook in before:   # the schedule's warm-up first
                    self._call(hook, "before_step")
                start = fold.start()
                items = self.step_items = self.step(ni, batch)
                counts = {}
                if progress is not None:
                    x, targets = self.last_batch
                    counts = {**self.task_postfix(targets), "size": x.shape[-1]}
                fold.push(i, start, items, counts)
                if len(fold.pending) > self.cfg.tune.loss_lag:   # the previous batch's: finished or finishing
                    fold.fold()
                    if progress is not None:
                        postfix()
                for hook in after:
                    self._call(hook, "after_step")
                if progress is not None:
                    progress.update(1)
                t_ready = time.perf_counter()
        except HookError:   # stopping: the error's frames must not keep the loader's workers alive
            batches = None
            raise
        fold.drain()
        self.loader_wait_s, self.sync_wait_s, self.step_device_s = wait, fold.sync_s, fold.device_s
        self.nonfinite_note = (f"{fold.first_nonfinite} ({fold.nonfinite} of {nb} batches)"
                               if fold.nonfinite else None)
        if progress is not None:
            postfix()
            progress.close()
        if self.last_opt_step < nb * (epoch + 1) - 1:
            # flush gradients still accumulating, so an epoch is self-contained and a
            # resumed run continues exactly where the interrupted one stopped
            self.optimizer_step()
            self.last_opt_step = nb * (epoch + 1) - 1
        return fold.mloss

    @staticmethod
    def task_postfix(targets) -> dict:
        """Progress-bar fields of the batch's (device) targets (detection: instances), as tensors
        the loop reads one step late (no sync)."""
        if len(targets) == 2 and targets[1].dtype == torch.bool:
            return {"inst": targets[1].sum()}
        return {}

    def _phase(self, epoch: int) -> None:
        """Before an epoch: phase changes that alter what the step computes release its graphs.
        The task's data phase ran already where the epoch's loader was prepared (before the
        previous epoch's validation: :meth:`_prepare_epoch`); its log line is here, at the
        epoch's start. It keeps the step's graphs: a captured step starts at the batch in its
        input buffers (the data pipeline, CPU or device augmentation, is never in the graph), and
        batches of another shape (fewer target rows without mosaic) get graphs of their own."""
        _, _, why = self._prepared_for(epoch)
        if why:
            log.info("%s", why)
        on_epoch = getattr(self.loss_fn, "on_epoch", None)
        if on_epoch is not None and on_epoch(epoch, self.cfg.run.epochs):
            # the loss computes something else from now on: graphs of the old loss are stale
            self.step_runner.release(f"{type(self.loss_fn).__name__} changed at epoch {epoch + 1}")
        if self.val_loss_fn is not None and hasattr(self.val_loss_fn, "on_epoch"):
            self.val_loss_fn.on_epoch(epoch, self.cfg.run.epochs)   # the validation loss follows it

    def _unfreeze(self) -> None:
        """``freeze`` holds for one run: a later ``train()`` of the model sees every layer trainable."""
        for p in self.frozen_params:
            p.requires_grad_(True)
        self.frozen_params = []

    def train(self) -> dict:
        """Train: set up, then the epochs, then end the run; returns its account (final and best
        metrics, history, losses, timing, the checkpoints' paths).

        Each epoch is the hooks' ``before_epoch``, :meth:`train_epoch` (per batch ``before_step``,
        the step, ``after_step``) and ``after_epoch`` (the schedule's decay, evaluation and early
        stopping, the logs, the checkpoints, a user's hooks, the timing, the stop decision), until
        the last epoch or a ``stop_reason``. Around the loop, :meth:`_running` holds the run: the
        set-up and the hooks' ``before_train`` before it; after it - also when it stops on an error
        or Ctrl-C - the hooks' ``after_train``, the loaders' workers, helper processes and the
        process group ended, the run folder's lock released (:class:`RunLock`).

        Ctrl-C (KeyboardInterrupt) stops the run cleanly: the checkpoint write in flight is
        finished (saves are atomic), no more plots are drawn, the loader workers and helper
        processes end, one line says what ``last.pt`` holds and how to continue, and a
        :class:`TrainingInterrupted` (a KeyboardInterrupt: a library does not swallow it) is
        raised with that line, without torch's frames. A dead DataLoader worker or rank stops
        it with one :class:`TrainingError` saying what is on disk; a hook that raises, with one
        :class:`~libreyolo.engine.hooks.HookError` naming it."""
        with self._running() as run:
            for epoch in run.epochs:
                self._begin_epoch(epoch)
                mloss = self.train_epoch(epoch)
                self._end_epoch(epoch, mloss)
                if self.stop_reason:
                    log.info("%s", self.stop_reason)
                    break
        return run.outcome()

    @contextlib.contextmanager
    def _running(self):
        """The run around the epochs (see :meth:`train`); yields a :class:`_Run` whose ``epochs``
        are those to train (none where Ctrl-C stopped the set-up) and whose ``outcome()`` is the
        run's account or raises its error - outside any handler, so without torch's frames."""
        run, yielded = _Run(), False
        try:
            self._setup_run()
            interval, grad_enabled = sys.getswitchinterval(), torch.is_grad_enabled()
            heap = contextlib.ExitStack()
            try:
                self._before_train(heap)
                run.epochs, yielded = range(self.start_epoch, self.cfg.run.epochs), True
                yield run
                if self.dist is not None:   # every rank returns rank 0's account of the run
                    (self.history, self.best_metrics, self.best_epoch, self.best_fitness) = self.dist.broadcast_object(
                        (self.history, self.best_metrics, self.best_epoch, self.best_fitness))
            except KeyboardInterrupt:   # Ctrl-C, wherever in the epochs: the hooks' ends below see it
                self.interrupted_in = self.epoch   # None: before the first epoch, in the hooks' start
                self._worker_signal.quiet = True   # the workers' exits as the run stops
                raise
            except RuntimeError as exc:
                run.error = self._stopped_by(exc)
                if run.error is None:
                    if isinstance(exc, TrainingDiverged) and (self.dist is None or self.dist.is_main):
                        load_best(self)   # best.pt's weights, not the diverged ones (its error says so)
                    raise
            finally:
                # a DataLoader worker's death arrives as an exception raised wherever the main thread is
                # (torch's SIGCHLD handler), also between a grad-mode switch and its restore (an
                # optimizer step, a no_grad block's exit): the run's end puts the caller's mode back
                sys.setswitchinterval(interval)
                torch.set_grad_enabled(grad_enabled)
                self._end_run(heap, run.error)
            if run.error is None:
                run.result = run_outcome(self)
        except KeyboardInterrupt as exc:
            if isinstance(exc, TrainingInterrupted):
                raise
            message = self._interrupted_message()
            log.warning("%s", message)
            run.error = TrainingInterrupted(message)
        finally:
            self.run_folder.release()
        if not yielded:
            yield run

    def _setup_run(self) -> None:
        """:meth:`setup` (what it made undone where it fails), then the run's state and timing."""
        self.interrupted_in = None   # the epoch Ctrl-C stopped (None: set-up, or not interrupted)
        self.stopping: BaseException | None = None   # the error the run stops with, at its end
        self._outer = sys.exc_info()[1]   # train() may run inside a caller's except block
        t_setup = time.perf_counter()
        try:
            self.setup()
        except BaseException:
            self._unfreeze()
            self.run_folder.release(failed_setup=True)
            if self.dist is not None:
                self.dist.teardown()
            raise
        cfg = self.cfg
        self.nw = max(round(cfg.optim.warmup_epochs * self.nb), 1) if cfg.optim.warmup_epochs > 0 else 0
        self.last_opt_step = self.nb * self.start_epoch - 1
        self.history: list[dict] = []
        self.stop_reason: str | None = None
        # the run's account of its epochs (the evaluation hook fills it on rank 0)
        self.best_metrics, self.epoch_metrics = None, {}
        self.best_epoch = getattr(self, "resumed_best_epoch", None)
        self.metric_keys = list(self.task.empty_metrics())
        self.opt.zero_grad(set_to_none=False)
        self.t_start = time.time()
        # where the run's wall goes (see timing_line): set-up, the epochs' steps, validation,
        # the rest of each epoch's end (checkpoint snapshot, CSV, the next epoch's loader), the end;
        # between_s and end_s by part: the next epoch's loader ("prepare"), each hook (less the
        # validation and the checkpoint waits counted apart), the loaders' shutdown ("loaders");
        # validation's time by part (see evaluate): the loader, the host part, the device's stage and loss
        self.timing = {"setup_s": time.perf_counter() - t_setup, "train_s": 0.0, "val_s": 0.0, "eval_s": 0.0,
                       "ckpt_wait_s": 0.0, "between_s": 0.0, "end_s": 0.0,
                       "between_parts": collections.defaultdict(float), "end_parts": collections.defaultdict(float),
                       "val_parts": collections.defaultdict(float)}

    def _before_train(self, heap: contextlib.ExitStack) -> None:
        """The hooks' ``before_train`` (those that ran get ``after_train``), then the interpreter
        set for the epochs: the heap frozen, the thread switch interval."""
        self._started: list[HookBase] = []
        for hook in self._all_hooks():
            self._started.append(hook)
            self._call(hook, "before_train")
        heap.enter_context(frozen_heap(self.cfg.tune.freeze_heap))
        if self.cfg.tune.switch_interval is not None:
            sys.setswitchinterval(self.cfg.tune.switch_interval)

    def _begin_epoch(self, epoch: int) -> None:
        """The epoch's phase (:meth:`_phase`), then the hooks' ``before_epoch``."""
        self.epoch = epoch
        self._t_epoch = time.time()
        self._phase(epoch)
        for hook in self._all_hooks():
            if hook.handles("before_epoch"):
                self._call(hook, "before_epoch")

    def _end_epoch(self, epoch: int, mloss: torch.Tensor) -> None:
        """The epoch's state (``epoch_state``), the next epoch's loader started, then the hooks'
        ``after_epoch``, each timed (less the validation and the waits it adds, counted apart)."""
        state = self.epoch_state = {"epoch": epoch, "mloss": mloss, "time_s": time.time() - self._t_epoch}
        # the epoch's mean loss, on the host already: non-finite if any step's was
        # (EvaluationHook adds the validation loss); such an epoch is never the best
        state["finite"] = bool(torch.isfinite(mloss).all())
        if not state["finite"]:
            state["nonfinite"] = self.nonfinite_note
        parts = self.timing["between_parts"]
        t_end = time.perf_counter()
        if self.cfg.tune.prefetch_next_epoch and epoch + 1 < self.cfg.run.epochs:
            self._prepare_epoch(epoch + 1)   # its first batches load while this one validates
        parts["prepare"] += time.perf_counter() - t_end

        def waits() -> float:   # an epoch end's time counted apart from between_s
            return state.get("val_s", 0.0) + state.get("ckpt_wait_s", 0.0)
        for hook in self._all_hooks():
            if hook.handles("after_epoch"):
                t_hook, counted = time.perf_counter(), waits()
                self._call(hook, "after_epoch")
                parts[hook.name] += time.perf_counter() - t_hook - (waits() - counted)

    def _stopped_by(self, exc: RuntimeError) -> TrainingError | None:
        """The error that stops a run on ``exc``: a collective that failed (another rank gone) or a
        DataLoader worker that died, each said with what is on disk; None: ``exc`` is raised as it is."""
        if isinstance(exc, TrainingError):
            return None
        where = f"in epoch {(self.epoch if self.epoch is not None else self.start_epoch) + 1}/{self.cfg.run.epochs}"
        d = self.dist
        if d is not None and d.failure(exc):
            return TrainingError(
                f"distributed training stopped {where} on rank {d.rank} of {d.world}: a collective failed "
                f"({type(exc).__name__}: {str(exc).strip()}). Another rank stopped (see its error and torchrun's "
                f"summary) or did not answer within ddp_timeout={self.cfg.run.ddp_timeout:g} s. "
                f"{self._last_pt_kept()}.")
        if not worker_died(exc):
            return None
        # raised outside the handler, with the loaders dropped: torch's error, its traceback and
        # the (persistent) iterators holding the dead worker's registration go, so torch's
        # SIGCHLD check does not fire again later
        self._worker_signal.quiet = True   # (if the loader's own check saw it first)
        close_loaders(self._drop_loaders, after_death=True)
        return TrainingError(f"training stopped {where}: a DataLoader worker process died ({str(exc).strip()}). "
                             "The usual cause is the out-of-memory killer: lower workers= or batch=, or see the "
                             f"system log. {self._last_pt_kept()}.")

    def _end_run(self, heap: contextlib.ExitStack, error: BaseException | None) -> None:
        """The hooks' ``after_train`` (those whose ``before_train`` ran; a user hook's error is
        raised after the others ran, or logged where the run already stops on an error), then -
        also when a built-in hook's end raises (a checkpoint's background write failed) - the
        heap, the frozen layers, the writer process, the loaders and the process group."""
        t_close = time.perf_counter()
        ends, timing = self.timing["end_parts"], self.timing
        in_flight, failed = sys.exc_info()[1], None
        if in_flight is self._outer:
            in_flight = None
        self.stopping = error or in_flight   # the hooks' ends see it: a write's error is then only logged
        try:
            for hook in getattr(self, "_started", []):
                t_hook = time.perf_counter()
                try:
                    self._call(hook, "after_train")
                except HookError as exc:
                    if self.stopping is not None or failed is not None:
                        log.error("%s", exc)
                    else:
                        failed = exc
                ends[hook.name] += time.perf_counter() - t_hook
        finally:   # also when a hook's end raises (a checkpoint's background write failed)
            heap.close()   # the objects frozen at the start are collectable again
            self._unfreeze()
            child = getattr(self, "checkpoint_writer_process", None)
            if child is not None:   # CheckpointHook's end closed it, unless a hook before it raised
                child.close()       # (after the write in flight: close waits for its lock)
            t_loaders = time.perf_counter()
            self._worker_signal.quiet = True   # the workers' exits as they are shut down
            close_loaders(self._drop_loaders)
            self._worker_signal.uninstall()
            ends["loaders"] += time.perf_counter() - t_loaders
            if self.dist is not None:
                if self.cfg.run.sync_bn:
                    revert_sync_batchnorm(self.net)
                self.dist.teardown()
            # no reference to the error in flight is kept: its frames hold the loaders' iterators,
            # whose workers end when they go
            self.stopping = self._outer = None
            timing["end_s"] = time.perf_counter() - t_close
        if failed is not None:
            raise failed

    def _saved(self) -> int | None:
        """The epoch ``last.pt`` holds (None: nothing saved); a resumed run that saved nothing yet
        holds the file it resumed from."""
        saved = getattr(self, "saved_epoch", None)
        return self.start_epoch if saved is None and self.start_epoch > 0 else saved

    def _interrupted_message(self) -> str:
        """What a run stopped by Ctrl-C has on disk (its write in flight was joined by the run's end)."""
        epoch = self.interrupted_in if self.interrupted_in is not None else self.epoch   # None: in set-up
        run_dir = getattr(self, "run_dir", None)
        saved = self._saved() if epoch is not None and run_dir is not None else None
        return interrupted_message(epoch, run_dir, self.cfg.run.epochs, saved)

    def _drop_loaders(self) -> None:
        """Every reference to the loaders and their iterators: a prefetched epoch's, validation's."""
        self.train_loader = self.val_loader = self.data = self._prepared = self._val_batches = None

    def _last_pt_kept(self) -> str:
        """What ``last.pt`` holds, for a run stopping on an error: the background write in flight
        is finished first (its own error logged), so the sentence says what is on disk."""
        writer = getattr(self, "checkpoint_writer", None)
        error = writer.close(raising=False) if writer is not None else None
        if error is not None:
            log.error("writing a checkpoint failed as well: %s", error)
        return last_pt_kept(self.run_dir, self._saved())

    @property
    def eval_net(self) -> nn.Module:
        return self.ema.ema if self.ema is not None else self.net

    def checkpoint(self, epoch: int, with_state: bool, host: bool = True) -> dict:
        """The LibreYOLO checkpoint of the EMA weights; ``with_state`` adds what ``resume`` needs
        (raw weights, optimizer, scaler, EMA count, epoch): ``last.pt`` only. The weights are
        host copies; with ``host=False`` they, like the optimizer's state always, are the
        device's tensors, for :class:`~libreyolo.weights.PackedSnapshot` to copy all at once."""
        from ..weights import state_dict_copies
        ck = self.model.checkpoint_of(self.eval_net, host)
        ck["train_metrics"] = self.epoch_metrics
        if with_state:
            ck["train_state"] = {
                "model_raw": state_dict_copies(self.net, host),
                "optimizer": self.opt.state_dict(), "scaler": self.scaler.state_dict(),
                "ema_updates": self.ema.updates if self.ema is not None else None,
                "epoch": epoch, "best_fitness": self.best_fitness, "best_epoch": self.best_epoch,
                "freeze": list(self.frozen),
                "args": {k: v for k, v in self.cfg.as_dict().items() if isinstance(v, (int, float, str, bool))},
            }
        return ck


class _Run:
    """What :meth:`Trainer._running` hands the loop: the epochs to train, then the outcome."""

    def __init__(self):
        self.epochs: range | tuple = ()
        self.result: dict | None = None
        self.error: BaseException | None = None

    def outcome(self) -> dict:
        """The run's account, or its error raised (here, outside any exception handler)."""
        if self.error is not None:
            raise self.error
        return self.result
