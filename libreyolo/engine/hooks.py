"""What the trainer does around its step, as hooks (in the manner of detectron2's ``HookBase``):
:class:`HookBase` and its events, the learning-rate schedule (:class:`ScheduleHook`), evaluation
and early stopping (:class:`EvaluationHook`), checkpoints (:class:`CheckpointHook`), the run's
time accounting (:class:`TimingHook`) and the stop decision every rank follows
(:class:`StopHook`); the logs are in :mod:`libreyolo.engine.loggers`. A user's hooks - objects,
or ``{event: fn}`` (:class:`CallbackHook`) - run after the built-in ones and before the timing
and the stop decision.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from .evaluate import evaluate, validation_stage
from .optim import set_lr
from .runs import TrainingDiverged, TrainingError

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger(__name__)

#: the events a hook may handle, in the order of a run
EVENTS = ("before_train", "before_epoch", "before_step", "after_step", "after_epoch", "after_train")


class HookError(TrainingError):
    """A hook raised: the run stopped (after its normal end: checkpoint write finished, workers
    stopped, run folder released); the message names the hook and the event, the hook's own
    exception is the cause."""


class HookBase:
    """Something done at the events of a run; :meth:`Trainer.register_hooks` sets
    :attr:`trainer`. Events, in order: ``before_train`` (after the set-up), then per epoch
    ``before_epoch``, per batch ``before_step`` and ``after_step``, ``after_epoch``, and once at the
    end (also when the run stops on an error or Ctrl-C) ``after_train`` - the latter only for
    hooks whose ``before_train`` ran. The trainer's state is public: ``trainer.epoch``,
    ``trainer.iter`` (the global batch index), ``trainer.step_items`` (after a step: its loss
    items, a device tensor not waited for), ``trainer.epoch_state`` (after an epoch: ``epoch``,
    ``mloss``, ``metrics``, ``is_best``, ...), ``trainer.history``; setting
    ``trainer.stop_reason`` in ``after_epoch`` stops the run after that epoch.

    ``before_step`` and ``after_step`` are called only for hooks that override them, so the step
    loop pays nothing for the others. A hook that raises stops the run with one
    :class:`HookError` naming it.
    """

    trainer: Trainer
    #: True: in a distributed run, only rank 0 runs this hook (those that validate, log, write)
    main_only: bool = False
    #: True: an exception of this hook stops the run as it is, not as a HookError (the built-in
    #: hooks, whose errors - a checkpoint write's, a diverged run's - say what happened)
    own_errors: bool = False

    @property
    def name(self) -> str:
        return type(self).__name__

    def handles(self, event: str) -> bool:
        """Whether this hook does something at ``event`` (it overrides the method)."""
        return getattr(type(self), event) is not getattr(HookBase, event)

    def before_train(self) -> None:
        pass

    def before_epoch(self) -> None:
        pass

    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass

    def after_epoch(self) -> None:
        pass

    def after_train(self) -> None:
        pass


def check_event(event: str) -> str:
    """``event`` if it is one of :data:`EVENTS`; else a ValueError listing them."""
    if event not in EVENTS:
        raise ValueError(f"unknown training event {event!r}; the events are {', '.join(EVENTS)}")
    return event


class CallbackHook(HookBase):
    """Functions at events, each called with the trainer: ``{event: fn}`` or ``{event: [fn, ...]}``
    (what ``model.train(callbacks=...)`` and ``model.add_callback`` give)."""

    def __init__(self, callbacks: dict[str, Any]):
        self.callbacks: dict[str, list[Callable]] = {}
        for event, fns in callbacks.items():
            fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
            for fn in fns:
                if not callable(fn):
                    raise TypeError(f"the callback for {check_event(event)!r} must be callable, got {fn!r}")
            self.callbacks.setdefault(check_event(event), []).extend(fns)
        self.current: Callable | None = None   # the function running (named if it raises)

    @property
    def name(self) -> str:
        fn = self.current
        return f"callback {getattr(fn, '__qualname__', None) or repr(fn)}" if fn is not None else "callback"

    def handles(self, event: str) -> bool:
        return bool(self.callbacks.get(event))

    def _run(self, event: str) -> None:
        for fn in self.callbacks.get(event, ()):
            self.current = fn
            fn(self.trainer)
        self.current = None

    def before_train(self) -> None:
        self._run("before_train")

    def before_epoch(self) -> None:
        self._run("before_epoch")

    def before_step(self) -> None:
        self._run("before_step")

    def after_step(self) -> None:
        self._run("after_step")

    def after_epoch(self) -> None:
        self._run("after_epoch")

    def after_train(self) -> None:
        self._run("after_train")


def as_hooks(hooks: Any) -> list[HookBase]:
    """``callbacks`` as hooks: a hook, a ``{event: fn}`` dict, or a list of them."""
    if hooks is None:
        return []
    if isinstance(hooks, (HookBase, dict)):
        hooks = [hooks]
    out = []
    for h in hooks:
        if isinstance(h, dict):
            h = CallbackHook(h)
        if not isinstance(h, HookBase):
            raise TypeError(f"callbacks: expected hook objects (libreyolo.engine.hooks.HookBase) or "
                            f"{{event: function}} dicts, got {type(h).__name__}")
        out.append(h)
    return out


class ScheduleHook(HookBase):
    """The learning rate's schedule: the warm-up before each of its batches (accumulation,
    learning rates and momentum ramp up), then per epoch the decay (linear or cosine from 1 to
    ``lrf``), set after the epoch's last update."""

    own_errors = True

    def before_step(self) -> None:
        t = self.trainer
        if t.nw > 0 and t.iter <= t.nw:
            self.warmup(t.iter, t.epoch)

    def warmup(self, ni: int, epoch: int) -> None:
        """Before batch ``ni`` of the warm-up: accumulation, learning rates and momentum ramp up."""
        t = self.trainer
        o, nw = t.cfg.optim, t.nw
        xi = [0, nw]
        t.accumulate = max(1, round(float(np.interp(ni, xi, [1, o.nbs / t.cfg.run.batch]))))
        for j, g in enumerate(t.opt.param_groups):
            start = o.warmup_bias_lr if j == 2 else 0.0
            set_lr(g, float(np.interp(ni, xi, [start, g["initial_lr"] * self.lr_factor(epoch)])))
            if "momentum" in g:
                g["momentum"] = float(np.interp(ni, xi, [o.warmup_momentum, o.momentum]))

    def lr_factor(self, epoch: float) -> float:
        """The learning rate's factor at ``epoch`` (linear or cosine from 1 to ``lrf``)."""
        cfg = self.trainer.cfg
        o = cfg.optim
        x = epoch / max(1, cfg.run.epochs)
        if o.cos_lr:
            return ((1 - math.cos(x * math.pi)) / 2) * (o.lrf - 1) + 1
        return (1 - x) * (1.0 - o.lrf) + o.lrf

    def after_epoch(self) -> None:
        t = self.trainer
        for g in t.opt.param_groups:
            set_lr(g, g["initial_lr"] * self.lr_factor(t.epoch + 1))


class EvaluationHook(HookBase):
    """The task's metrics of the EMA weights on the validation split; fitness and best epoch.

    Without validation (``val=False``, or an empty validation split) there is no fitness to
    compare: every epoch counts as the best, so ``best.pt`` follows ``last.pt`` (the latest
    weights) and ``best_metrics`` stays None. With ``patience=N`` the run stops after N epochs
    without a better fitness than the best epoch's, with one log line saying so.
    """

    main_only, own_errors = True, True   # rank 0 alone validates

    def before_train(self) -> None:
        t = self.trainer
        self.pool = self.stage = self.graph_info = None
        if t.cfg.run.val and len(t.val_set) > 0:
            self.pool = t.task.evaluation_pool(t.cfg.tune.processes())

    def validate(self, net: nn.Module, loader, progress: bool = False, loss_fn: nn.Module | None = None) -> dict:
        """The task's metrics of ``net`` on ``loader`` with the run's settings (its device, AMP,
        layout, seed, evaluation pool; the validation stage kept for the run, so its graph is
        captured once): :func:`~libreyolo.engine.evaluate.evaluate`, whose :class:`Evaluation`
        is left in ``trainer.last_evaluation``."""
        t = self.trainer
        self.stage = validation_stage(t.model, net, loader, t.cfg.graph.cuda_graph, t.device, t.cfg.tune.val_capturer,
                                      self.stage)
        ev = t.last_evaluation = evaluate(
            t.model, loader, net=net, options=t.cfg.task, device=t.device, amp_dtype=t.amp_dtype,
            memory_format=t.memory_format, stage=self.stage, pool=self.pool, progress=progress, loss_fn=loss_fn,
            seed=t.cfg.run.seed, batches=t.prefetched_validation(loader))
        return ev.metrics

    def after_epoch(self) -> None:
        t = self.trainer
        state = t.epoch_state
        writer = getattr(t, "checkpoint_writer", None)
        t0 = time.perf_counter()
        join = t.cfg.tune.join_write_before_validation
        if join is None:   # the child may have gone since: then the writer thread writes again
            child = getattr(t, "checkpoint_writer_process", None)
            join = child is None or child.proc is None
        if writer is not None and join:
            writer.wait()   # the previous epoch's checkpoints are on disk before validation
        metrics = t.task.empty_metrics()
        t.last_evaluation = None
        t1 = time.perf_counter()
        validated = t.cfg.run.val and len(t.val_set) > 0
        if validated:
            metrics = self.validate(t.eval_net, t.val_loader, progress=t.cfg.run.verbose, loss_fn=t.val_loss_fn)
        ev = t.last_evaluation
        state["val_s"], state["ckpt_wait_s"] = time.perf_counter() - t1, t1 - t0
        state["eval_s"] = ev.eval_s if ev is not None else 0.0
        state["val_parts"] = dict(ev.parts) if validated and ev is not None else {}
        epoch = state["epoch"] + 1
        vloss = state["val_loss"] = ev.loss if ev is not None else None
        if vloss is not None and not bool(torch.isfinite(vloss).all()):
            state["finite"] = False   # the evaluated (EMA) weights give no finite loss
            state.setdefault("nonfinite", f"non-finite validation loss at epoch {epoch}: {vloss.tolist()}")
        finite = state.get("finite", True)
        # a NaN fitness is the worst, and an epoch with a non-finite loss is never the best
        fitness = t.task.fitness(metrics)
        state["metrics"], state["is_best"] = metrics, finite and (better_fitness(fitness, t.best_fitness) or not validated)
        t.epoch_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if not validated:
            if finite:
                t.best_epoch = epoch
            return
        if state["is_best"]:
            t.best_fitness = fitness
            t.best_metrics, t.best_epoch = dict(t.epoch_metrics), epoch
        patience = t.cfg.run.patience
        if patience and t.best_epoch is not None and epoch - t.best_epoch >= patience and epoch < t.cfg.run.epochs:
            t.stop_reason = (f"early stopping after epoch {epoch}/{t.cfg.run.epochs}: the validation fitness has "
                             f"not improved for {epoch - t.best_epoch} epochs (patience={patience}); the best, "
                             f"epoch {t.best_epoch} (fitness {t.best_fitness:.4f}), is best.pt")

    def after_train(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()
        if self.stage is not None:   # its graphs (and their memory) end with the run
            self.graph_info, self.stage = self.stage.info(), None


class CheckpointHook(HookBase):
    """``last.pt`` every epoch (with the training state, for ``resume``), ``best.pt`` when the
    fitness improved (weights and metadata only: a third of the size), and with ``save_period=N``
    ``epoch{N}.pt``, ``epoch{2N}.pt``, ... (with the training state, like ``last.pt``); all atomic.

    Written in the background (:class:`~libreyolo.engine.background.BackgroundJob`): at the end
    of an epoch the checkpoint is copied to host memory (:class:`~libreyolo.weights.PackedSnapshot`,
    so the next steps cannot change what is written), then one thread writes them - each through
    :func:`~libreyolo.weights.save_checkpoint`, temp file + rename - while the next epoch trains.
    With ``checkpoint_process`` (``TrainConfig.tune``) (on CUDA by default) that thread hands the snapshot to a
    child interpreter (:class:`~libreyolo.engine.ckptwriter.WriterProcess`), which splits and
    pickles it there, away from the step loop's GIL; without the child the thread writes itself.
    The write is joined before the next epoch's validation (unless
    ``join_write_before_validation`` says otherwise: by default not when a child process
    writes), before the next write, at the end of
    the run and when it stops on an error; an error of the write (a full disk) is raised there.
    ``t.saved_epoch`` counts the epochs whose ``last.pt`` is on disk.
    """

    main_only, own_errors = True, True

    def before_train(self) -> None:
        t = self.trainer
        from .background import BackgroundJob
        t.checkpoint_writer = self.writer = BackgroundJob("checkpoint writer")
        child = t.cfg.tune.checkpoint_process
        if child is None:
            child = t.device.type == "cuda"
        self.process = None
        if child:   # it starts (imports torch) while the first epoch trains
            from .ckptwriter import WriterProcess
            self.process = WriterProcess()
            if self.process.proc is None:
                self.process = None
        t.checkpoint_writer_process = self.process

    def after_epoch(self) -> None:
        t = self.trainer
        state = t.epoch_state
        from ..weights import PackedSnapshot
        epoch, weights = state["epoch"], t.run_dir / "weights"
        t0 = time.perf_counter()
        self.writer.wait()   # the previous epoch's files first (and its error, if it failed)
        # counted in the run's timing; the epoch's results.csv row, written before, has the wait
        # before validation only
        state["ckpt_wait_s"] = state.get("ckpt_wait_s", 0.0) + time.perf_counter() - t0
        # every tensor (weights, EMA weights, optimizer state) copied to the host in a few
        # transfers; the writer thread splits them into the checkpoint's tensors
        # (the weights contiguous, as every LibreYOLO checkpoint holds them; the optimizer state
        # in its parameters' layout, which a fused optimizer requires when it is resumed)
        snapshot = PackedSnapshot(t.checkpoint(epoch, with_state=True, host=False),
                                  contiguous=("model", "train_state.model_raw"))
        names = ["last.pt"]
        if state["is_best"]:
            names.append("best.pt")
        period = t.cfg.run.save_period
        if period and (epoch + 1) % period == 0:   # a snapshot one can also resume from
            names.append(f"epoch{epoch + 1}.pt")
        self.writer.submit(self._write, t, epoch, snapshot, [weights / n for n in names],
                           what=f"epoch {epoch + 1}'s checkpoints in {weights}")

    def _write(self, t: Trainer, epoch: int, snapshot, paths: list) -> None:
        from .ckptwriter import write_snapshot
        process, written = getattr(self, "process", None), []
        try:
            if process is None or not process.write(snapshot, paths, written):
                write_snapshot(snapshot, paths, written)
        finally:
            if any(p.name == "last.pt" for p in written):
                t.saved_epoch = epoch + 1

    def after_train(self) -> None:
        t = self.trainer
        writer = getattr(self, "writer", None)
        if writer is None:
            return
        stopping = t.stopping is not None   # ending on another error: keep it
        try:
            error = writer.close(raising=not stopping)
        finally:
            if getattr(self, "process", None) is not None:
                self.process.close()
        if error is not None:
            log.error("writing a checkpoint failed as well: %s", error)


def better_fitness(fitness: float, best: float) -> bool:
    """Whether ``fitness`` beats ``best``: NaN is the worst of all (never better, beaten by any
    number), where a plain ``>`` would leave a NaN best unbeatable."""
    return fitness == fitness and (best != best or fitness > best)


def timing_line(timing: dict) -> str:
    """One line of where a run's wall went (:attr:`Trainer.timing`, seconds)."""
    total = sum(timing[k] for k in ("setup_s", "train_s", "val_s", "ckpt_wait_s", "between_s", "end_s"))

    def parts(key: str) -> str:   # the parts of a figure, largest first, those of 0.05 s and more
        named = sorted(((v, k[:-4].lower() if k.endswith("Hook") else k) for k, v in timing.get(key, {}).items()
                        if v >= 0.05), reverse=True)
        return f" ({', '.join(f'{k} {v:.1f}' for v, k in named)})" if named else ""

    vp = timing.get("val_parts", {})
    names = (("host", "host part"), ("stage", "device stage"), ("loss", "device loss"), ("loader", "loader"))
    val = "".join(f", {name} {vp[k]:.1f}" for k, name in names if vp.get(k, 0.0) >= 0.05)
    return (f"{total:.1f} s in train(): set-up {timing['setup_s']:.1f}, epochs {timing['train_s']:.1f}, "
            f"validation {timing['val_s']:.1f} (evaluation {timing['eval_s']:.1f}{val}), waiting for checkpoint "
            f"writes {timing['ckpt_wait_s']:.1f}, the rest of the epochs' ends {timing['between_s']:.1f}"
            f"{parts('between_parts')}, end {timing['end_s']:.1f}{parts('end_parts')}")


class TimingHook(HookBase):
    """Where the run's wall goes (``trainer.timing``, see :func:`timing_line`):
    per epoch the steps' time, validation (its evaluation and its parts), the waits for checkpoint
    writes, and the rest of the epoch's end (the trainer times each hook: ``between_parts``)."""

    own_errors = True

    def after_epoch(self) -> None:
        t = self.trainer
        state, timing = t.epoch_state, t.timing
        timing["train_s"] += state["time_s"]
        for k in ("val_s", "eval_s", "ckpt_wait_s"):
            timing[k] += state.get(k, 0.0)
        for k, v in state.get("val_parts", {}).items():
            timing["val_parts"][k] += v
        timing["between_s"] = sum(timing["between_parts"].values())


class StopHook(HookBase):
    """The decision to go on, which every rank of a distributed run follows: rank 0 checks the
    epoch's losses (:meth:`check_finite`) and its hooks may have set ``trainer.stop_reason``
    (early stopping); the others receive both. A diverged run stops here with a
    :class:`~libreyolo.engine.runs.TrainingDiverged`; a stop reason ends the loop after the epoch."""

    own_errors = True

    def before_train(self) -> None:
        self.nonfinite_run, self.nonfinite_first, self.warned = 0, None, False

    def after_epoch(self) -> None:
        t = self.trainer
        d = t.dist
        diverged = self.check_finite(t.epoch, t.epoch_state) if d is None or d.is_main else None
        if d is not None:   # the others wait here for rank 0's epoch end, and its decision
            t.stop_reason, diverged = d.broadcast_object((t.stop_reason, diverged))
        if diverged is not None:
            raise TrainingDiverged(diverged)

    def check_finite(self, epoch: int, state: dict) -> str | None:
        """After epoch ``epoch``'s end: None, or the message of a diverged run. An epoch whose
        mean training loss (read from the steps one step late: no added sync) or validation loss
        is not finite is counted; the first one is a warning, ``nan_patience`` of them in a row -
        or one as the run's last epoch, whose weights the run would hand back - stop the run."""
        t = self.trainer
        if state.get("finite", True):
            self.nonfinite_run = 0
            return None
        self.nonfinite_run = n = self.nonfinite_run + 1
        cfg, what = t.cfg, state.get("nonfinite") or f"non-finite loss at epoch {epoch + 1}"
        if n == 1:
            self.nonfinite_first = what   # the streak's first, named in the error
        what = self.nonfinite_first or what
        patience = cfg.run.nan_patience
        if n < patience and epoch + 1 < cfg.run.epochs and not t.stop_reason:
            if not self.warned:
                self.warned = True
                log.warning("%s; training goes on, and stops if the loss is not finite for %d epochs "
                            "in a row (nan_patience=%d); an epoch with a non-finite loss is never best.pt",
                            what, patience, patience)
            return None
        o = cfg.optim
        span = f"epoch {epoch + 1}" if n == 1 else f"epochs {epoch + 2 - n}-{epoch + 1}"
        hints = [f"lower lr0 (this run: {o.lr0:g})", f"clip the gradients harder with a lower clip_grad (this run: "
                 f"{o.clip_grad:g})", f"lengthen warmup_epochs (this run: {o.warmup_epochs:g})"]
        if t.amp_dtype == torch.float16:
            hints.append("use amp=bf16 or amp=false (float16 may overflow)")
        best = (f"best.pt holds epoch {t.best_epoch}, the best with finite losses, and the model now holds its "
                "weights" if t.best_epoch is not None
                else "no epoch of this run had finite losses, so it wrote no best.pt, and the model holds the "
                     "diverged weights (load a checkpoint or build the model again before training anew)")
        return (f"training diverged: the loss was not finite in {span} of {cfg.run.epochs} ({what}; "
                f"nan_patience={patience}). To fix it: {'; '.join(hints)}; or check the labels. {best}; last.pt "
                f"holds the diverged weights of epoch {epoch + 1}")

