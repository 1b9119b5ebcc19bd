"""The run's logs, as hooks: ``results.csv``, the per-epoch line and ``results.png``
(:class:`LoggingHook`), TensorBoard event files (:class:`TensorBoardHook`), and the experiment
trackers ``loggers=`` names - MLflow, Weights & Biases, Comet, ClearML, DVCLive - each an
:class:`ExperimentLogger` (optional packages, one extra each; a tracker that fails is one warning
and never stops the run).
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
                              f"(or pip install 'libreyolo-graphs[tensorboard]'); {exc}") from None
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


# --------------------------------------------------------------------------------------------------
# Experiment trackers: MLflow, Weights & Biases, Comet, ClearML, DVCLive
# --------------------------------------------------------------------------------------------------


class ExperimentLogger(HookBase):
    """Base of the experiment-tracker hooks (``loggers=mlflow,wandb,comet,clearml,dvclive``): at the
    start the run's hyperparameters (every training option, the model's family, size and task),
    per epoch the numbers of its ``results.csv`` row (losses, metrics, learning rates, times; step
    = the epoch, from 1), at the end the run's plots and ``results.csv`` as files and
    ``weights/best.pt`` as the model.

    The package is imported when the trainer is built, so a missing one is an ImportError before
    any work. After that a tracker never stops the run: the first exception of a subclass's
    method (a server that does not answer, a refused key, a full disk) is one warning line, and
    that tracker logs nothing more in this run while training goes on. Subclasses implement
    :meth:`start`, :meth:`log_epoch`, :meth:`log_files` and :meth:`finish`."""

    main_only, own_errors = True, True
    #: the ``loggers=`` name, the package to import, the pip requirement and libreyolo's extra
    NAME = PACKAGE = PIP = EXTRA = ""

    def __init__(self) -> None:
        import importlib
        try:
            self.module = importlib.import_module(self.PACKAGE)
        except ImportError as exc:
            raise ImportError(f"loggers={self.NAME} needs the {self.PIP} package: pip install {self.PIP} "
                              f"(or pip install 'libreyolo-graphs[{self.EXTRA}]'); {exc}") from None
        self.active = self.started = False

    @property
    def name(self) -> str:
        return f"loggers={self.NAME}"

    def _guard(self, what: str, fn: Any, *args: Any) -> None:
        """``fn(*args)`` while this tracker is active; its exception is one warning and the end
        of this tracker's logging for the run."""
        if not self.active:
            return
        try:
            fn(*args)
        except Exception as exc:   # noqa: BLE001 - a tracker is never worth a failed run
            self.active = False
            log.warning("loggers=%s: %s failed, so this run logs nothing more there (training goes on): %s: %s",
                        self.NAME, what, type(exc).__name__, " ".join(str(exc).split())[:400])

    def before_train(self) -> None:
        t = self.trainer
        self.active = True
        self._guard("starting its run", self._start, t)

    def _start(self, t: Trainer) -> None:
        self.start(t, Path(t.run_dir), run_params(t))
        self.started = True

    def after_epoch(self) -> None:
        t = self.trainer
        epoch = t.epoch_state["epoch"] + 1
        self._guard(f"logging epoch {epoch}", self.log_epoch, epoch, epoch_metrics(t))

    def after_train(self) -> None:
        t = self.trainer
        run_dir = Path(t.run_dir)
        files = sorted(p for p in run_dir.glob("*") if p.suffix.lower() in (".png", ".jpg") and p.is_file())
        csv_path = run_dir / "results.csv"
        best = run_dir / "weights" / "best.pt"
        self._guard("logging the plots and best.pt", self.log_files, files + ([csv_path] if csv_path.is_file() else []),
                    best if best.is_file() else None)
        if self.started:   # a run begun is ended, also after a failed log call
            self.active = True
            self._guard("ending its run", self.finish, t.stopping is not None)
        self.active = False

    # the tracker's own calls

    def start(self, t: Trainer, run_dir: Path, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def log_files(self, files: list[Path], best: Path | None) -> None:
        raise NotImplementedError

    def finish(self, failed: bool) -> None:
        raise NotImplementedError


def run_params(t: Trainer) -> dict[str, Any]:
    """The run's hyperparameters for a tracker: every training option (None, bool, int, float and
    str as they are, anything else as its text) and the model's family, size and task."""
    params: dict[str, Any] = {}
    model = t.model
    params["model_family"] = getattr(model, "FAMILY", "")
    params["model_size"] = str(getattr(model, "size", ""))
    params["task"] = str(getattr(model, "TASK", ""))
    for key, value in t.cfg.as_dict().items():
        params[key] = value if value is None or isinstance(value, (bool, int, float, str)) else \
            (",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))
    return params


def epoch_metrics(t: Trainer) -> dict[str, float]:
    """The epoch's numbers for a tracker: the finite values of its ``results.csv`` row (losses,
    metrics, times; the columns with a ``/``) and every parameter group's learning rate."""
    row = t.history[-1] if t.history else {}
    out = {k: float(v) for k, v in row.items() if "/" in k and isinstance(v, (int, float))
           and not isinstance(v, bool) and math.isfinite(v)}
    for j, g in enumerate(t.opt.param_groups):
        out[f"lr/pg{j}"] = float(g["lr"])
    return out


def _env_or(var: str, default: str) -> str:
    return os.environ.get(var, "").strip() or default


class MLflowHook(ExperimentLogger):
    """``loggers=mlflow``: an MLflow run (tracking URI: ``$MLFLOW_TRACKING_URI``, else MLflow's
    default; experiment: ``$MLFLOW_EXPERIMENT_NAME``, else the project folder's name, e.g.
    ``detect``; run name: the run folder's) with the options as parameters, the epoch's numbers
    as metrics, and the plots, ``results.csv`` and ``best.pt`` as artifacts (``plots/``,
    ``weights/``). Through ``MlflowClient``: an active run of the caller's is left alone."""

    NAME, PACKAGE, PIP, EXTRA = "mlflow", "mlflow", "mlflow-skinny", "mlflow"

    def start(self, t: Trainer, run_dir: Path, params: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        self.client = client = MlflowClient()
        name = _env_or("MLFLOW_EXPERIMENT_NAME", run_dir.parent.name or "libreyolo")
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        self.run_id = client.create_run(exp_id, run_name=run_dir.name, tags={"libreyolo.run_dir": str(run_dir)}).info.run_id
        client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, epoch) for k, v in metrics.items()])

    def log_files(self, files: list[Path], best: Path | None) -> None:
        for f in files:
            self.client.log_artifact(self.run_id, str(f), "plots" if f.suffix != ".csv" else None)
        if best is not None:
            self.client.log_artifact(self.run_id, str(best), "weights")

    def finish(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


class WandbHook(ExperimentLogger):
    """``loggers=wandb``: a Weights & Biases run (project: ``$WANDB_PROJECT``, else the project
    folder's name; name: the run folder's; its files under the run folder's ``wandb/``;
    ``WANDB_MODE=offline`` keeps it on disk for ``wandb sync``) with the options as its config,
    the epoch's numbers logged at step = epoch, the plots as images and ``best.pt`` as a model
    artifact."""

    NAME, PACKAGE, PIP, EXTRA = "wandb", "wandb", "wandb", "wandb"

    def start(self, t: Trainer, run_dir: Path, params: dict[str, Any]) -> None:
        wandb = self.module
        self.run = wandb.init(project=_env_or("WANDB_PROJECT", run_dir.parent.name or "libreyolo"),
                              name=run_dir.name, config=params, dir=str(run_dir), reinit="create_new")

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, "epoch": epoch}, step=epoch)

    def log_files(self, files: list[Path], best: Path | None) -> None:
        wandb = self.module
        images = {f"plots/{f.stem}": wandb.Image(str(f)) for f in files if f.suffix != ".csv"}
        if images:
            self.run.log(images, commit=True)
        for f in files:
            if f.suffix == ".csv":
                self.run.save(str(f), base_path=str(f.parent), policy="now")
        if best is not None:
            art = wandb.Artifact(f"{_artifact_name(self.run.name or 'run')}-best", type="model")
            art.add_file(str(best), name="best.pt")
            self.run.log_artifact(art)

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class CometHook(ExperimentLogger):
    """``loggers=comet``: a Comet experiment (project: ``$COMET_PROJECT_NAME``, else the project
    folder's name) with the options as parameters, the epoch's numbers as metrics (step = epoch),
    the plots as images, ``results.csv`` as an asset and ``best.pt`` as the model ``best``.
    Without an API key (``$COMET_API_KEY`` or Comet's config file), or with
    ``COMET_MODE=offline``, it is an offline experiment: an archive in
    ``$COMET_OFFLINE_DIRECTORY``, else the run folder's ``comet/``, for ``comet upload``."""

    NAME, PACKAGE, PIP, EXTRA = "comet", "comet_ml", "comet_ml", "comet"

    def start(self, t: Trainer, run_dir: Path, params: dict[str, Any]) -> None:
        comet = self.module
        from comet_ml import ExperimentConfig
        key = os.environ.get("COMET_API_KEY") or comet.config.get_config("comet.api_key")
        online = bool(key) and os.environ.get("COMET_MODE", "").strip().lower() != "offline"
        cfg = ExperimentConfig(name=run_dir.name, log_code=False, log_git_metadata=False, log_git_patch=False,
                               auto_output_logging=False, display_summary_level=0,
                               offline_directory=_env_or("COMET_OFFLINE_DIRECTORY", str(run_dir / "comet")))
        self.exp = comet.start(project_name=_env_or("COMET_PROJECT_NAME", run_dir.parent.name or "libreyolo"),
                               online=online, experiment_config=cfg)
        self.exp.log_parameters(params)

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.exp.log_metrics(metrics, step=epoch, epoch=epoch)

    def log_files(self, files: list[Path], best: Path | None) -> None:
        for f in files:
            if f.suffix == ".csv":
                self.exp.log_asset(str(f))
            else:
                self.exp.log_image(str(f), name=f.stem)
        if best is not None:
            self.exp.log_model("best", str(best))

    def finish(self, failed: bool) -> None:
        self.exp.end()


class ClearMLHook(ExperimentLogger):
    """``loggers=clearml``: a ClearML task (project: the project folder's name; task: the run
    folder's; ClearML's own configuration, ``CLEARML_OFFLINE_MODE=1`` for an offline session)
    with the options as its ``Hyperparameters`` section, the epoch's numbers as scalars (title:
    the part before ``/``, series: the rest; iteration = epoch), the plots as debug images,
    ``results.csv`` and ``best.pt`` as artifacts and, online, ``best.pt`` as the output model. ClearML's
    automatic framework logging is off: the hook says what is logged."""

    NAME, PACKAGE, PIP, EXTRA = "clearml", "clearml", "clearml", "clearml"

    def start(self, t: Trainer, run_dir: Path, params: dict[str, Any]) -> None:
        from clearml import Task
        self.task = Task.init(project_name=run_dir.parent.name or "libreyolo", task_name=run_dir.name,
                              reuse_last_task_id=False, auto_connect_frameworks=False,
                              auto_connect_arg_parser=False, auto_resource_monitoring=False,
                              auto_connect_streams=False)
        self.task.connect(params, name="Hyperparameters")
        self.logger = self.task.get_logger()
        self.epoch = 0

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            title, _, series = key.partition("/")
            self.logger.report_scalar(title, series or title, value, iteration=epoch)
        self.epoch = epoch

    def log_files(self, files: list[Path], best: Path | None) -> None:
        for f in files:
            if f.suffix == ".csv":
                self.task.upload_artifact(f.name, artifact_object=str(f), wait_on_upload=True)
            else:
                self.logger.report_image("plots", f.stem, iteration=self.epoch, local_path=str(f))
        if best is not None:
            self.task.upload_artifact("best.pt", artifact_object=str(best), wait_on_upload=True)
            from clearml import OutputModel, Task
            if not Task.is_offline():   # an offline session keeps artifacts, not registered models
                OutputModel(task=self.task, name="best", framework="PyTorch").update_weights(
                    weights_filename=str(best), auto_delete_file=False)

    def finish(self, failed: bool) -> None:
        if failed:
            self.task.mark_failed(status_reason="training stopped on an error", force=True)
        self.task.close()


class DVCLiveHook(ExperimentLogger):
    """``loggers=dvclive``: DVCLive in the run folder's ``dvclive/`` (``params.yaml``,
    ``metrics.json``, one ``.tsv`` per number under ``plots/metrics``; step = epoch) with the
    plots as images and ``best.pt`` as a model artifact (DVCLive tracks artifacts inside a DVC
    repository only; elsewhere it skips them, with its own warning)."""

    NAME, PACKAGE, PIP, EXTRA = "dvclive", "dvclive", "dvclive", "dvclive"

    def start(self, t: Trainer, run_dir: Path, params: dict[str, Any]) -> None:
        self.live = self.module.Live(dir=str(run_dir / "dvclive"))
        self.live.log_params(params)

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.live.step = epoch
        for key, value in metrics.items():
            self.live.log_metric(key, value)
        self.live.next_step()

    def log_files(self, files: list[Path], best: Path | None) -> None:
        for f in files:
            if f.suffix != ".csv":
                self.live.log_image(f.name, str(f))
        if best is not None:
            self.live.log_artifact(str(best), type="model", name="best")

    def finish(self, failed: bool) -> None:
        self.live.end()


#: ``loggers=`` name -> its hook class (tensorboard's is :class:`TensorBoardHook`)
EXPERIMENT_LOGGERS: dict[str, type[ExperimentLogger]] = {
    h.NAME: h for h in (MLflowHook, WandbHook, CometHook, ClearMLHook, DVCLiveHook)}


def _artifact_name(text: str) -> str:
    """``text`` with what a W&B artifact name may not hold replaced by ``-``."""
    import re
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"
