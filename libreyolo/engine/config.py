"""Training options as data: the groups of :class:`TrainConfig` (``run``, ``optim``, ``graph``, and
the task's own options dataclass), each field with its default. Every route into training (the
Python API, the CLI, a distributed rank) builds one :class:`TrainConfig` from flat keywords.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..tasks import Task, TaskOptions, get_task

__all__ = ["RunConfig", "OptimConfig", "GraphConfig", "TrainConfig"]


@dataclass
class RunConfig:
    """What to train on and where the run goes."""

    data: str = "shapes"
    epochs: int = 100
    batch: int = 16
    imgsz: int = 640
    device: str = "auto"
    workers: Any = None             # DataLoader workers; None: auto (see default_workers)
    val: bool = True
    project: str = "runs/train"
    name: str = "exp"
    exist_ok: bool = False
    resume: Any = False             # True (the run's last.pt) or a path
    cache: Any = "auto"             # "ram" / "disk": decode + letterbox every image once (False: each
                                    # epoch; "auto": RAM when the images fit, see DetectionDataset.cache_images)
    seed: int = 0
    plots: bool = True
    verbose: bool = True
    patience: int = 0               # stop after N epochs without a better fitness (0: never)
    freeze: Any = None              # the first N layers, or parameter-name prefixes (see freeze_prefixes)
    save_period: int = 0            # also weights/epoch{N}.pt every N epochs (0: never)
    loggers: Any = None             # "tensorboard" (events in the run folder), or none
    sync_bn: Any = False            # distributed runs: BatchNorm statistics over the global batch (CUDA)
    ddp_timeout: Any = 1800         # distributed runs: seconds a collective may wait (a dead rank's limit)
    nan_patience: int = 3           # stop after N epochs in a row with a non-finite loss (see Trainer._check_finite)


@dataclass
class OptimConfig:
    """Optimizer, schedule, accumulation, EMA."""

    optimizer: str = "SGD"          # SGD or AdamW
    lr0: float | None = None        # default 0.01 for SGD, 0.001 for AdamW
    lrf: float = 0.01               # final lr = lr0 * lrf
    momentum: float = 0.937
    weight_decay: float = 5e-4
    clip_grad: float = 10.0         # max gradient norm (YOLO recipes 10; DETR recipes 0.1)
    warmup_epochs: float = 3.0
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    cos_lr: bool = False
    nbs: int = 64                   # nominal batch: gradients accumulate up to it
    ema: bool = True


@dataclass
class GraphConfig:
    """How the step runs: CUDA graphs, mixed precision."""

    cuda_graph: bool = False
    amp: Any = True                 # True: float16 autocast + GradScaler; "bf16": bfloat16, no scaler (CUDA only)
    channels_last: Any = None       # network and batches in NHWC; None: on CUDA if the family declares CHANNELS_LAST


_GROUPS = {"run": RunConfig, "optim": OptimConfig, "graph": GraphConfig}


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
        known = {name: group for group, cls in _GROUPS.items() for name in (f.name for f in fields(cls))}
        task_names = task.Options.names()
        unknown = sorted(set(kw) - set(known) - task_names - {"extra"})
        if unknown:
            raise TypeError(f"unknown training option(s): {', '.join(unknown)}; known: "
                            f"{', '.join(sorted(set(known) | task_names))}")
        split: dict[str, dict[str, Any]] = {g: {} for g in _GROUPS}
        for k, v in kw.items():
            if k in known:
                split[known[k]][k] = v
        self.run = RunConfig(**split["run"])
        self.optim = OptimConfig(**split["optim"])
        self.graph = GraphConfig(**split["graph"])
        self.tune = TuneConfig(**split["tune"])   # not in as_dict(): how the host works, not the run's recipe
        self.task: TaskOptions = task.Options(**{k: v for k, v in kw.items() if k in task_names})
        self.extra: dict = dict(kw.get("extra") or {})

    @classmethod
    def from_kwargs(cls, task: str | Task = "detect", **kw: Any) -> "TrainConfig":
        return cls(task, **kw)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("run", "optim", "graph", "task", "extra"):
            raise AttributeError(name)
        for group in (self.run, self.optim, self.graph, self.task):
            if name in group.__dataclass_fields__:
                return getattr(group, name)
        raise AttributeError(f"TrainConfig has no option {name!r}")

    def as_dict(self) -> dict[str, Any]:
        """Every option, flat."""
        return {**asdict(self.run), **asdict(self.optim), **asdict(self.graph), **asdict(self.task)}


@dataclass
class TuneConfig:
    """How the loop uses the host (group ``tune``): switches that change when the host does
    things, never the numbers; the benchmarks compare their arms."""

    #: start the next epoch's loader (its workers on its first batches) before this epoch's
    #: validation and checkpoints; False: when the next epoch begins
    prefetch_next_epoch: bool = True
    #: start the validation loader's workers on its first batches before the epoch's last step,
    #: so validation does not begin by waiting for them (its batches do not depend on the epoch)
    prefetch_validation: bool = True
    #: steps the loop reads a step's loss behind: 1, the device runs step i while the host reads
    #: step i-1's; 0, each step waited for at once (a synchronous loop: the same numbers)
    loss_lag: int = 1
    #: the interpreter's thread switch interval (sys.setswitchinterval, seconds) for the run, then
    #: restored; None keeps Python's 5 ms. The checkpoint writer and the plotter hold the GIL while
    #: they pickle and draw, and a main thread that released it (to wait on the device, to launch
    #: a replay) gets it back only at the next switch: a shorter interval bounds that wait
    switch_interval: float | None = None
    #: the epoch's end joins the previous epoch's checkpoint write before validating (True), or
    #: only before the next write, so that the write overlaps validation (False).
    #: None: False when a child process writes (it takes no GIL from validation), else True
    join_write_before_validation: bool | None = None
    #: the objects alive when the epochs start are left out of the garbage collector's full
    #: collections for the run (engine.background.frozen_heap); False: Python's default
    freeze_heap: bool = True
    #: checkpoints written by a child interpreter (engine.ckptwriter: the pickling off this
    #: process's GIL, which the step loop needs); None: on CUDA runs, where a GIL-starved loop
    #: leaves the device idle. False: the writer thread writes them itself
    checkpoint_process: bool | None = None
    #: helper processes the validations' evaluation may use (Task.evaluation_pool: detection
    #: deals its classes out to them, the same figures); below 2: each evaluation in this process.
    #: None: a quarter of the cores, at most 4 (none on a machine of fewer than 8: a pool needs two)
    eval_processes: int | None = None
    #: how validation graphs are captured (None: CUDA graphs; tests pass a CPU stand-in)
    val_capturer: Any = None


    def processes(self) -> int:
        """``eval_processes``, None resolved against this machine's cores."""
        if self.eval_processes is not None:
            return self.eval_processes
        import os
        return min(4, (os.cpu_count() or 1) // 4)


_GROUPS["tune"] = TuneConfig
__all__.append("TuneConfig")
