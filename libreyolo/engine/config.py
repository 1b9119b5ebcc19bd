"""Training options as data: the groups of :class:`TrainConfig` (``run``, ``optim``, ``graph``, and
the task's own options dataclass), each field declared with :func:`libreyolo.options.option`: its
default, its help and its check. Each group checks its fields when it is made (the same checks,
with the same messages, as the CLI's, which is generated from these fields; docs/options.md too).
Every route into training (the Python API, the CLI, a distributed rank) builds one
:class:`TrainConfig` from flat keywords.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..options import (
    AMP_FAMILY_DEFAULT,
    BOOL_FALSE,
    BOOL_TRUE,
    LOGGERS,
    MAX_SEED,
    MAX_WORKERS,
    Bool,
    Choice,
    Custom,
    Float,
    Fraction,
    Int,
    OptionError,
    Text,
    check_fields,
    check_imgsz,
    did_you_mean,
    option,
    parse_amp,
    parse_bool,
    parse_cache,
    parse_freeze,
    parse_loggers,
)
from ..tasks import Task, TaskOptions, get_task

__all__ = ["GROUPS", "GraphConfig", "OptimConfig", "RunConfig", "TrainConfig", "TuneConfig"]


def _amp(name: str, value: Any) -> Any:
    """``amp`` as train and predict keep it: False, True (the family's dtype), "fp16" or "bf16"."""
    import torch
    dtype = parse_amp(value)
    if dtype is None:
        return False
    if dtype is AMP_FAMILY_DEFAULT:
        return True
    return "bf16" if dtype is torch.bfloat16 else "fp16"


def _resume(name: str, value: Any) -> Any:
    """True/False, or the path of a run's last.pt (a file that exists)."""
    if isinstance(value, (str, os.PathLike)) and str(value).strip().lower() not in BOOL_TRUE + BOOL_FALSE:
        if not Path(value).expanduser().is_file():
            raise OptionError(f"{name} must be true, false or the path of a last.pt file, got {str(value)!r} "
                              "(no such file)")
        return value
    try:
        return parse_bool(name, value)
    except OptionError:
        raise OptionError(f"{name} must be true, false or the path of a last.pt file, got {value!r}") from None


def _imgsz(name: str, value: Any) -> int:
    # the family's stride is applied once the model is known (rounding up, with one warning)
    return check_imgsz(value, 1, name)


def _devices(name: str, value: Any) -> Any:
    return value   # auto, cpu, cuda, cuda:1, an index, or several GPUs: checked where the run starts


_IMGSZ = Custom(_imgsz, "positive integer (pixels), rounded up to the family's stride")
_AMP = Custom(_amp, "false, true (the family's dtype), fp16 or bf16")


@dataclass
class RunConfig:
    """What to train on and where the run goes."""

    data: str | None = option(None, "dataset YAML (YOLO or COCO format), a dataset folder, or a built-in set by "
                                    "name (e.g. shapes); required (default: none)", Text("path or built-in name"))
    epochs: int = option(100, "training epochs", Int(1))
    batch: int = option(16, "batch size (several GPUs: the global batch)", Int(1))
    imgsz: int = option(640, "training size (default: the family's, e.g. 640 for detectors, 224 for classifiers)",
                        _IMGSZ)
    device: str = option("auto", "auto, cpu, cuda, cuda:1; several GPUs (0,1) train one process per GPU under "
                                 "torchrun", Custom(_devices, "device or GPU list"))
    workers: Any = option(None, "DataLoader workers (default: auto, up to 8 on CUDA and 2 on the CPU, capped by "
                                "the cores, the batches and the memory)", Int(0, MAX_WORKERS, none=True))
    val: bool = option(True, "validate after every epoch (false: no validation, best.pt = last.pt)", Bool())
    project: str | None = option(None, "where runs are written (default: runs/<task>, e.g. runs/detect)",
                                 Text("path"))
    name: str | None = option(None, "run name (default: train; the run folder is project/name, numbered when it "
                                    "exists: train2, ...)", Text("name"))
    exist_ok: bool = option(False, "reuse the run folder", Bool())
    resume: Any = option(False, "true (this run's last.pt) or the path of a last.pt", Custom(
        _resume, "true, false or the path of a last.pt"))
    cache: Any = option("auto", "ram or disk: decode and resize every image once, before the first epoch; auto "
                                "(default): in RAM when the images need at most a quarter of the free memory and "
                                "4 GiB; false: read the files every epoch",
                        Custom(lambda n, v: parse_cache(v), "ram, disk, auto or false"))
    seed: int = option(0, "random seed (initial weights, data order, augmentation)", Int(0, MAX_SEED))
    plots: bool = option(True, "write the run's pictures (curves, labels, validation batches)", Bool())
    verbose: bool = option(True, "progress bars and per-epoch lines", Bool())
    patience: int = option(0, "stop after N epochs without a better validation fitness (0: never)", Int(0))
    freeze: Any = option(None, "freeze the first N layers, or parameter-name prefixes, e.g. freeze=3 or "
                               "freeze=backbone,neck.down1", Custom(lambda n, v: parse_freeze(v),
                                                                   "layer count or name prefixes", none=True))
    save_period: int = option(0, "also save weights/epochN.pt every N epochs (0: never)", Int(0))
    loggers: Any = option(None, "experiment loggers, comma-separated: tensorboard (event files in the run "
                                "folder), mlflow, wandb, comet, clearml, dvclive (each needs its package)",
                          Custom(lambda n, v: parse_loggers(v), "none or " + ", ".join(LOGGERS), none=True))
    sync_bn: Any = option(False, "several GPUs: BatchNorm statistics over the global batch (SyncBatchNorm)",
                          Bool())
    ddp_timeout: Any = option(1800, "several GPUs: seconds a rank waits for the others before the run stops "
                                    "with an error", Float(0.0, min_inclusive=False))
    nan_patience: int = option(3, "stop after N epochs in a row with a non-finite loss", Int(1))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class OptimConfig:
    """Optimizer, schedule, accumulation, EMA."""

    optimizer: str = option("SGD", "SGD or AdamW (default: the family's recipe, SGD for the YOLO families)",
                            Choice("SGD", "AdamW"))
    lr0: float | None = option(None, "initial learning rate (default: the family's, else 0.01 SGD, 0.001 AdamW)",
                               Float(0.0, min_inclusive=False, none=True))
    lrf: float = option(0.01, "final learning rate as a fraction of lr0", Float(0.0, 1.0))
    momentum: float = option(0.937, "SGD momentum / Adam beta1", Float(0.0, 1.0, max_inclusive=False))
    weight_decay: float = option(5e-4, "weight decay (of the weights, not of BatchNorm or biases)", Float(0.0))
    clip_grad: float = option(10.0, "largest gradient norm (YOLO recipes 10, DETR recipes 0.1)",
                              Float(0.0, min_inclusive=False))
    warmup_epochs: float = option(3.0, "epochs of linear warm-up (fractions allowed)", Float(0.0))
    warmup_momentum: float = option(0.8, "momentum at the start of the warm-up", Fraction())
    warmup_bias_lr: float = option(0.1, "learning rate of the biases at the start of the warm-up", Float(0.0))
    cos_lr: bool = option(False, "cosine instead of linear decay", Bool())
    nbs: int = option(64, "nominal batch: gradients accumulate up to it", Int(1))
    ema: bool = option(True, "keep an exponential moving average of the weights (what is validated and saved)",
                       Bool())

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class GraphConfig:
    """How the step runs: CUDA graphs, mixed precision."""

    cuda_graph: bool = option(False, "capture the training step in CUDA graphs (eager fallback, one log line)",
                              Bool())
    amp: Any = option(True, "autocast on CUDA: true (float16 with a GradScaler), fp16, bf16 (no scaler) or false",
                      _AMP)
    channels_last: Any = option(None, "NHWC network and batches: true, false or auto (on CUDA for the families "
                                      "that declare it)", Bool(none=True))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class TuneConfig:
    """How the loop uses the host (group ``tune``): when it does things, never the numbers.

    The benchmarks compare their arms. Not part of :meth:`TrainConfig.as_dict` (a run's recipe):
    the same run gives the same results.csv with any of them. ``switch_interval``: the checkpoint
    writer and the plotter hold the GIL while they pickle and draw, and a main thread that released
    it (to wait on the device, to launch a replay) gets it back only at the next switch; a shorter
    interval bounds that wait. ``threads``: torch's intra-op threads on the CPU (see
    :mod:`libreyolo.threads`); there a different count may split a float reduction differently.
    """

    prefetch_next_epoch: bool = option(
        True, "start the next epoch's loader before this epoch's validation and checkpoints", Bool())
    prefetch_validation: bool = option(
        True, "start the validation loader's workers before the epoch's last step", Bool())
    loss_lag: int = option(
        1, "steps the loop reads a step's loss behind (0: each step waited for; the same numbers)", Int(0))
    switch_interval: float | None = option(
        None, "the interpreter's thread switch interval during the run, seconds (default: Python's 5 ms)",
        Float(0.0, 1.0, min_inclusive=False, none=True))
    join_write_before_validation: bool | None = option(
        None, "wait for the previous checkpoint write before validating (default: only when this process "
              "writes)", Bool(none=True))
    freeze_heap: bool = option(
        True, "leave the objects alive when the epochs start out of the garbage collector's full collections",
        Bool())
    checkpoint_process: bool | None = option(
        None, "write checkpoints from a child interpreter (default: on CUDA runs)", Bool(none=True))
    eval_processes: int | None = option(
        None, "helper processes for the validations' evaluation, below 2: none (default: a quarter of the "
              "cores, at most 4)", Int(0, MAX_WORKERS, none=True))
    threads: int | None = option(
        None, "torch's intra-op threads on the CPU (default: from the cores this process can get: affinity, "
              "cgroup quota, load; also LIBREYOLO_THREADS)", Int(1, none=True))
    #: how validation graphs are captured (None: CUDA graphs; tests pass a CPU stand-in)
    val_capturer: Any = option(None, "validation graph capturer (tests)", cli=False)

    def __post_init__(self) -> None:
        check_fields(self)

    def processes(self) -> int:
        """``eval_processes``, None resolved against this machine's cores."""
        if self.eval_processes is not None:
            return self.eval_processes
        return min(4, (os.cpu_count() or 1) // 4)


#: the training option groups, by the name TrainConfig gives each (cfg.run, cfg.optim, cfg.graph)
GROUPS = {"run": RunConfig, "optim": OptimConfig, "graph": GraphConfig, "tune": TuneConfig}


class TrainConfig:
    """Training options in groups: ``run`` (:class:`RunConfig`), ``optim`` (:class:`OptimConfig`),
    ``graph`` (:class:`GraphConfig`) and ``task`` (the task's options dataclass, e.g.
    :class:`~libreyolo.tasks.detect.DetectOptions`: augmentation, validation thresholds).

    Built from flat keyword arguments (``TrainConfig(epochs=10, lr0=0.01, mosaic=0.5)``), each
    routed to its group; an unknown name is a TypeError listing the known ones. Reading a flat
    name (``cfg.lr0``) reads it from its group.
    """

    def __init__(self, task: str | Task = "detect", **kw: Any):
        task = get_task(task) if isinstance(task, str) else task
        known = {name: group for group, cls in GROUPS.items() for name in (f.name for f in fields(cls))}
        task_names = task.Options.names()
        unknown = sorted(set(kw) - set(known) - task_names - {"extra"})
        if unknown:
            raise TypeError(f"unknown training option(s): {', '.join(unknown)}"
                            f"{did_you_mean(unknown, set(known) | task_names)}; known: "
                            f"{', '.join(sorted(set(known) | task_names))}")
        split: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
        for k, v in kw.items():
            if k in known:
                split[known[k]][k] = v
        self.run = RunConfig(**split["run"])
        if self.run.project is None:   # runs/<task>/train, train2, ... (the layout Ultralytics users know)
            self.run.project = str(Path("runs") / task.name)
        if self.run.name is None:
            self.run.name = "train"
        self.optim = OptimConfig(**split["optim"])
        self.graph = GraphConfig(**split["graph"])
        self.tune = TuneConfig(**split["tune"])   # not in as_dict(): how the host works, not the run's recipe
        self.task: TaskOptions = task.Options(**{k: v for k, v in kw.items() if k in task_names})
        self.extra: dict = dict(kw.get("extra") or {})

    @classmethod
    def from_kwargs(cls, task: str | Task = "detect", **kw: Any) -> TrainConfig:
        return cls(task, **kw)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("run", "optim", "graph", "tune", "task", "extra"):
            raise AttributeError(name)
        for group in (self.run, self.optim, self.graph, self.tune, self.task):
            if name in group.__dataclass_fields__:
                return getattr(group, name)
        raise AttributeError(f"TrainConfig has no option {name!r}")

    def as_dict(self) -> dict[str, Any]:
        """Every option, flat."""
        return {**asdict(self.run), **asdict(self.optim), **asdict(self.graph), **asdict(self.task)}
