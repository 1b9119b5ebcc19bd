"""The run's logs, as hooks: ``results.csv``, the per-epoch line and ``results.png``
(:class:`LoggingHook`), TensorBoard event files (:class:`TensorBoardHook`).
"""
from __future__ import annotations

import csv
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..logs import package_logger, stream_handler
from .hooks import HookBase

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger(__name__)


class LoggingHook(HookBase):
    """``results.csv``, the per-epoch log line, ``results.png``.

    With ``verbose`` the line reaches the user even where logging is not configured (the Python
    API): a handler is attached to the ``libreyolo`` logger for the run when it has none and the
    root logger has none either.
    """

    main_only, own_errors = True, True   # rank 0 alone logs

    def before_train(self) -> None:
        t = self.trainer
        from .background import BackgroundJob
        from .plots import PlotProcess
        self._handler = None
        self._warned: set[str] = set()
        self._plotter = BackgroundJob("plotter")   # waits on the drawing child (or draws, without one)
        self._child = PlotProcess() if self.plot_in_child else None
        # a second child for the last validation's curves, started now so that it is warm at
        # the end, where it draws them while the first draws the final results.png
        second = self.curves_child if self.curves_child is not None else t.device.type == "cuda"
        self._curves_child = None
        if self._child is not None and second and t.cfg.run.plots and t.cfg.run.val:
            self._curves_child = PlotProcess()
            self._curves_child.start()
        # results.csv is rewritten whole (atomically) every epoch from these rows, so a full disk
        # or a kill never leaves half a line, and rows that could not be written are not lost.
        # A resumed run keeps the rows up to the epoch it resumes from: epochs it redoes (their
        # row was written, then the run died before last.pt) are not listed twice.
        self.rows = [r for r in _read_csv(t.csv_path) if _epoch_of(r) <= t.start_epoch] if t.start_epoch else []
        if t.start_epoch:
            self._write_csv(t)
        root, lib = logging.getLogger(), package_logger()
        if t.cfg.run.verbose and not lib.handlers and not root.handlers:
            # a run started from Python with no logging set up shows its lines as the command
            # line does ("libreyolo: epoch ..."), for the run only
            self._handler = stream_handler()
            lib.addHandler(self._handler)
            self._level = lib.level
            if lib.getEffectiveLevel() > logging.INFO:
                lib.setLevel(logging.INFO)

    def after_epoch(self) -> None:
        t = self.trainer
        state = t.epoch_state
        epoch, mloss, metrics = state["epoch"], state["mloss"], state["metrics"]
        vloss = state.get("val_loss")
        vloss = vloss.tolist() if vloss is not None else [float("nan")] * len(t.item_names)
        row = {"epoch": epoch + 1, **{f"train/{n}_loss": float(v) for n, v in zip(t.item_names, mloss.tolist())},
               **{f"val/{n}_loss": float(v) for n, v in zip(t.item_names, vloss)},
               **t.task.metric_columns(metrics), "lr/pg0": float(t.opt.param_groups[0]["lr"]),
               "time/epoch_s": round(state["time_s"], 3),
               # where an epoch goes: waiting for batches, validating (the rest is the steps)
               "time/loader_wait_s": round(getattr(t, "loader_wait_s", 0.0), 3),
               # the steps' span on the device (CUDA events; elsewhere their host time), and the
               # host's time blocked on the device (the loop reads each step's loss one step late)
               "time/step_device_s": round(getattr(t, "step_device_s", 0.0), 3),
               "time/sync_wait_s": round(getattr(t, "sync_wait_s", 0.0), 3),
               "time/val_s": round(state.get("val_s", 0.0), 3),
               # of validation, the evaluator's host part (matching, COCO mAP, curves)
               "time/eval_s": round(state.get("eval_s", 0.0), 3),
               # the epoch's end waiting for the previous epoch's checkpoint write
               "time/ckpt_wait_s": round(state.get("ckpt_wait_s", 0.0), 3)}
        row.update({k: metrics[k] for k in t.metric_keys if k in metrics})
        t.history.append(row)
        self.rows.append({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()
                          if k not in t.metric_keys})
        csv_ok = self._write_csv(t)
        if t.cfg.run.verbose:
            log.info("epoch %d/%d  %s  %s  (%.1f s)", epoch + 1, t.cfg.run.epochs,
                     "  ".join(f"{n} {v:.4f}" for n, v in zip(t.item_names, mloss.tolist())),
                     t.task.summary(metrics), state["time_s"])
        # results.png costs a matplotlib figure (the first one also matplotlib's import): drawn
        # by a child interpreter (PlotProcess; a drawing in this one, even in a thread, slowed
        # the epoch beside it by a second) while the next epoch trains, at most every
        # PLOT_EVERY_S (and never two at once), and at the end of the run. Not after the first
        # epoch: one point is no curve
        if t.cfg.run.plots and csv_ok and len(self.rows) >= 2 \
                and time.time() - getattr(self, "_plotted_at", 0.0) >= self.PLOT_EVERY_S and not self._plotter.busy():
            self._plotted_at, self._plotted_rows = time.time(), len(self.rows)
            self._plotter.submit(self._plot, t, what="results.png")

    #: seconds between two drawings of results.png during a run (it is drawn at the end too)
    PLOT_EVERY_S = 30.0
    #: draw results.png in a child interpreter (engine.plots.PlotProcess); False: in a thread here
    plot_in_child = True
    #: a second plot child for the last validation's curves (PR, confusion matrix), drawn beside
    #: the final results.png instead of after it; None: on CUDA runs (a CPU run's cores train)
    curves_child: bool | None = None

    def _plot(self, t: Trainer) -> None:
        """Draw results.png from results.csv (which is replaced whole, never read half-written)."""
        try:
            if self._child is not None:
                self._child.draw(t.csv_path)
            else:
                from .plots import plot_results
                plot_results(t.csv_path)
        except Exception as exc:  # a plot is never worth a failed run
            self._plotted_rows = -1   # drawn again at the next chance (the end at the latest)
            self._warn_once("plot", "could not draw results.png (training goes on; further "
                            "failures are not reported): %s", exc)

    def _warn_once(self, what: str, msg: str, *args: Any) -> None:
        """A warning the first time ``what`` fails in this run, a debug line after that."""
        log.log(logging.DEBUG if what in self._warned else logging.WARNING, msg, *args)
        self._warned.add(what)

    def _write_csv(self, t: Trainer) -> bool:
        """Rewrite ``results.csv`` from :attr:`rows`; a failed write (a full disk) is one warning,
        the old file stays whole and the rows are written with the next epoch's."""
        try:
            _write_csv_atomic(t.csv_path, self.rows)
            return True
        except OSError as exc:
            self._warn_once("csv", "could not write %s (training goes on; the file keeps its "
                            "earlier rows and the missing ones are written once a write succeeds): %s",
                            t.csv_path, exc)
            return False

    def after_train(self) -> None:
        t = self.trainer
        plotter = getattr(self, "_plotter", None)
        if plotter is not None:   # on_train_start ran
            curves_child = getattr(self, "_curves_child", None)
            # Ctrl-C: the run stops now, with no final drawings (results.png keeps its last one)
            plots = t.cfg.run.plots and getattr(t, "interrupted_in", None) is None
            try:
                plotter.close()   # _plot never raises: a failed drawing is a warning
                if plots and t.history and getattr(self, "_plotted_rows", 0) != len(self.rows) \
                        and t.csv_path.is_file():
                    self._plotted_rows = len(self.rows)
                    plotter.submit(self._plot, t, what="results.png")   # the last rows, if drawn before them
                evaluator = t.last_evaluation.evaluator if t.last_evaluation is not None else None
                if plots and evaluator is not None and t.history:
                    # the last epoch's validation: PR curves, confusion matrix, a validation batch;
                    # the matplotlib figures in a warm child - the second one, beside the first's
                    # results.png, where there is one - while this process draws the rest
                    evaluator.plotter = curves_child or self._child   # a failed child sends nothing: drawn here
                    try:
                        evaluator.plot(t.run_dir)
                    except Exception as exc:  # a plot is never worth a failed run
                        log.warning("could not draw the validation plots: %s", exc)
                    finally:
                        evaluator.plotter = None
                plotter.close()
            finally:
                if self._child is not None:
                    self._child.close()
                if curves_child is not None:
                    curves_child.close()
        if self._handler is not None:
            lib = package_logger()
            lib.removeHandler(self._handler)
            lib.setLevel(self._level)
            self._handler = None


class TensorBoardHook(HookBase):
    """``loggers=tensorboard``: TensorBoard event files in the run folder - per epoch the training
    losses, the metrics, every parameter group's learning rate, the epoch time, and a few
    validation images with the predictions drawn (where the task draws them: detection).
    View with ``tensorboard --logdir runs/detect`` (the task's runs)."""

    main_only, own_errors = True, True
    #: validation images logged per epoch
    IMAGES = 4

    def __init__(self) -> None:   # built with the Trainer: a missing package fails before any work
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:   # torch's writer needs the tensorboard package
            raise ImportError("loggers=tensorboard needs the tensorboard package: pip install tensorboard "
                              f"(or pip install 'libreyolo[tensorboard]'); {exc}") from None
        self._writer_cls, self.writer = SummaryWriter, None

    def before_train(self) -> None:
        t = self.trainer
        # a resumed run drops the events of the epochs it redoes
        self.writer = self._writer_cls(log_dir=str(t.run_dir), purge_step=t.start_epoch + 1 if t.start_epoch else None)

    def after_epoch(self) -> None:
        t = self.trainer
        state = t.epoch_state
        epoch, w = state["epoch"] + 1, self.writer
        row = t.history[-1] if t.history else {}
        for key, value in row.items():
            if "/" in key and not key.startswith("lr/") and isinstance(value, (int, float)) and math.isfinite(value):
                w.add_scalar(key, value, epoch)
        for j, g in enumerate(t.opt.param_groups):
            w.add_scalar(f"lr/pg{j}", float(g["lr"]), epoch)
        evaluator = t.last_evaluation.evaluator if t.last_evaluation is not None else None
        if evaluator is not None and t.cfg.run.val:
            for i, image in enumerate(evaluator.images(self.IMAGES)):
                w.add_image(f"val/image{i}", image, epoch, dataformats="CHW")
        w.flush()

    def after_train(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _read_csv(path: Path) -> list[dict]:
    """The rows of an existing ``results.csv`` (none if it is missing or unreadable)."""
    try:
        with path.open(newline="") as f:
            return [dict(r) for r in csv.DictReader(f)]
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def _epoch_of(row: dict) -> int:
    try:
        return int(row.get("epoch") or 0)
    except ValueError:
        return 0


def _write_csv_atomic(path: Path, rows: list[dict]) -> None:
    """``rows`` as a CSV at ``path`` (columns: every key, in order of first appearance), written to
    a temp file and renamed over the old one: readers never see a partial file."""
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(columns), restval="")
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
