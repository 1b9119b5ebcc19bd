"""What the trainer does around the epochs, as hooks: evaluation and early stopping
(:class:`EvaluationHook`) and checkpoints (:class:`CheckpointHook`); the logs are in
:mod:`libreyolo.engine.loggers`.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger(__name__)


class Hook:
    """Something done around the epochs (see :meth:`Trainer.train`); hooks run in list order."""

    def on_train_start(self, t: Trainer) -> None:
        pass

    def on_epoch_end(self, t: Trainer, state: dict) -> None:
        pass

    def on_train_end(self, t: Trainer) -> None:
        pass


class EvaluationHook(Hook):
    """The task's metrics of the EMA weights on the validation split; fitness and best epoch.

    Without validation (``val=False``, or an empty validation split) there is no fitness to
    compare: every epoch counts as the best, so ``best.pt`` follows ``last.pt`` (the latest
    weights) and ``best_metrics`` stays None. With ``patience=N`` the run stops after N epochs
    without a better fitness than the best epoch's, with one log line saying so.
    """

    def on_train_start(self, t: Trainer) -> None:
        t.best_metrics, t.epoch_metrics = None, {}
        t.best_epoch = getattr(t, "resumed_best_epoch", None)
        t.metric_keys = list(t.task.empty_metrics())
        t.eval_pool = None
        main = t.dist is None or t.dist.is_main   # rank 0 alone validates
        if main and t.cfg.run.val and len(t.val_set) > 0:
            t.eval_pool = t.task.evaluation_pool(t.eval_processes)

    def on_epoch_end(self, t: Trainer, state: dict) -> None:
        writer = getattr(t, "checkpoint_writer", None)
        t0 = time.perf_counter()
        join = t.join_write_before_validation
        if join is None:   # the child may have gone since: then the writer thread writes again
            child = getattr(t, "checkpoint_writer_process", None)
            join = child is None or child.proc is None
        if writer is not None and join:
            writer.wait()   # the previous epoch's checkpoints are on disk before validation
        metrics = t.task.empty_metrics()
        t.val_loss, t.val_eval_s = None, 0.0
        t1 = time.perf_counter()
        validated = t.cfg.run.val and len(t.val_set) > 0
        if validated:
            metrics = t.validate(t.eval_net, t.val_loader, progress=t.cfg.run.verbose, loss_fn=t.val_loss_fn)
        state["val_s"], state["ckpt_wait_s"] = time.perf_counter() - t1, t1 - t0
        state["eval_s"] = t.val_eval_s
        state["val_parts"] = dict(getattr(t, "val_parts", {})) if validated else {}
        epoch = state["epoch"] + 1
        vloss = getattr(t, "val_loss", None)
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

    def on_train_end(self, t: Trainer) -> None:
        pool, t.eval_pool = getattr(t, "eval_pool", None), None
        if pool is not None:
            pool.close()
        stage = getattr(t, "_val_stage", None)
        if stage is not None:   # its graphs (and their memory) end with the run
            t.val_graph_info = stage.info()
            t._val_stage = None


class CheckpointHook(Hook):
    """``last.pt`` every epoch (with the training state, for ``resume``), ``best.pt`` when the
    fitness improved (weights and metadata only: a third of the size), and with ``save_period=N``
    ``epoch{N}.pt``, ``epoch{2N}.pt``, ... (with the training state, like ``last.pt``); all atomic.

    Written in the background (:class:`~libreyolo.engine.background.BackgroundJob`): at the end
    of an epoch the checkpoint is copied to host memory (:class:`~libreyolo.weights.PackedSnapshot`,
    so the next steps cannot change what is written), then one thread writes them - each through
    :func:`~libreyolo.weights.save_checkpoint`, temp file + rename - while the next epoch trains.
    With ``Trainer.checkpoint_process`` (on CUDA by default) that thread hands the snapshot to a
    child interpreter (:class:`~libreyolo.engine.ckptwriter.WriterProcess`), which splits and
    pickles it there, away from the step loop's GIL; without the child the thread writes itself.
    The write is joined before the next epoch's validation (unless
    ``Trainer.join_write_before_validation`` says otherwise: by default not when a child process
    writes), before the next write, at the end of
    the run and when it stops on an error; an error of the write (a full disk) is raised there.
    ``t.saved_epoch`` counts the epochs whose ``last.pt`` is on disk.
    """

    def on_train_start(self, t: Trainer) -> None:
        import sys
        from .background import BackgroundJob
        t.checkpoint_writer = self.writer = BackgroundJob("checkpoint writer")
        self._outer = sys.exc_info()[1]   # train() may run inside a caller's except block
        child = t.checkpoint_process
        if child is None:
            child = t.device.type == "cuda"
        self.process = None
        if child:   # it starts (imports torch) while the first epoch trains
            from .ckptwriter import WriterProcess
            self.process = WriterProcess()
            if self.process.proc is None:
                self.process = None
        t.checkpoint_writer_process = self.process

    def on_epoch_end(self, t: Trainer, state: dict) -> None:
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

    def on_train_end(self, t: Trainer) -> None:
        import sys
        writer = getattr(self, "writer", None)
        if writer is None:
            return
        in_flight = sys.exc_info()[1]
        stopping = in_flight is not None and in_flight is not self._outer   # ending on another error: keep it
        try:
            error = writer.close(raising=not stopping)
        finally:
            if getattr(self, "process", None) is not None:
                self.process.close()
        if error is not None:
            log.error("libreyolo: writing a checkpoint failed as well: %s", error)


def better_fitness(fitness: float, best: float) -> bool:
    """Whether ``fitness`` beats ``best``: NaN is the worst of all (never better, beaten by any
    number), where a plain ``>`` would leave a NaN best unbeatable."""
    return fitness == fitness and (best != best or fitness > best)
