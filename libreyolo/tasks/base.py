"""What a task is to the engine: the hooks that make predict, train and val task-generic.

A task (detect, classify, semantic, ...) is one folder under ``libreyolo/tasks/`` with a
:class:`Task` subclass. The engine's loops (``engine/predictor.py``, ``engine/trainer.py``) call
only these hooks; a family declares its task by name (``Model.TASK``) and supplies the network,
its ``infer`` (network input -> fixed-shape outputs) and, for training, ``train_forward``.

Predict: :meth:`Task.plan` returns a :class:`PredictPlan` for one call. Its :meth:`finish` runs
on the device after ``model.infer`` - inside the captured stage, so it must be graph-safe (fixed
shapes, no host synchronisation) - and its :meth:`results` turns the stage's outputs into one
:class:`~libreyolo.results.Results` per image on the host.

Training and validation: :meth:`Task.resolve_data` reads a dataset spec, :meth:`Task.datasets`
builds the train and val datasets whose collate gives ``(images_uint8, *targets)``; the loss
takes ``(outputs, *targets)``; an :class:`Evaluator` accumulates validation batches and returns
the metrics, of which :meth:`Task.fitness` picks what ``best.pt`` is chosen by.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from ..ops.letterbox import geometry_rows


def host_views(maps: Sequence[torch.Tensor], download: Callable[[torch.Tensor], torch.Tensor] | None = None
               ) -> list[torch.Tensor]:
    """Per-image device maps (each its own shape) -> the same maps on the host, through one copy
    of all of them (one transfer, one synchronization per chunk instead of one per image).
    ``download`` does the copy (default ``.cpu()``; depth passes its pinned-memory download)."""
    flat = torch.cat([m.reshape(-1) for m in maps]) if len(maps) > 1 else maps[0].reshape(-1)
    host = download(flat) if download is not None else flat.cpu()
    out, start = [], 0
    for m in maps:
        n = m.numel()
        out.append(host[start:start + n].view(m.shape))
        start += n
    return out


class Evaluator:
    """Accumulates a validation split: ``reset()``, ``process(outputs, batch)`` per batch (the
    stage's outputs on the device - :meth:`finish` of the model's ``infer`` outputs - and the
    loader's CPU batch), then ``evaluate()``."""

    def reset(self) -> None:
        raise NotImplementedError

    def finish(self, outputs: Any) -> Any:
        """``model.infer`` outputs -> what :meth:`process` takes: the device part of the
        evaluation that runs inside validation's stage (captured with the network when the run
        uses CUDA graphs), so it must be graph-safe (fixed shapes, no host synchronisation),
        return batch-first tensors (validation pads a last partial batch and keeps the first
        rows) and depend only on the evaluator's class and the options :attr:`stage_tag`
        names. Default: unchanged."""
        return outputs

    #: the options :meth:`finish` depends on (part of validation's graph key): none by default
    stage_tag: tuple = ()

    def process(self, outputs: Any, batch: Sequence[torch.Tensor]) -> None:
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        raise NotImplementedError

    #: helper processes a training run lends to :meth:`evaluate` (the task's
    #: :meth:`Task.evaluation_pool`); None: it evaluates in the caller's process
    pool: Any = None
    #: a training run's plot child (engine.plots.PlotProcess) that :meth:`plot` may hand its
    #: matplotlib figures to (set by the trainer for the run's last plots), or None
    plotter: Any = None

    def plot(self, run_dir) -> list:
        """Pictures of the last evaluation written into ``run_dir`` (none by default)."""
        return []

    #: whether :meth:`coco_predictions` is implemented (``val(save_json=True)``)
    writes_coco_json: ClassVar[bool] = False

    def coco_predictions(self, dataset: Any, data: Any) -> list[dict]:
        """The last evaluation's predictions as COCO results records (``image_id``,
        ``category_id``, ``bbox`` [x, y, w, h] in the original image's pixels, ``score``)."""
        raise NotImplementedError(f"{type(self).__name__} has no COCO results format")

    def images(self, n: int) -> list:
        """Up to ``n`` validation images of the last evaluation with the predictions drawn, as
        uint8 (3, H, W) tensors, for experiment loggers (none by default)."""
        return []


class PredictPlan:
    """The task-specific part of one predict call (see the module docstring).

    ``tag``: what the stage computes besides the network (part of every graph key);
    ``host``: the stage's outputs go to the host as a :class:`~libreyolo.graphs.capture.HostCopy`;
    ``constant``: positions of :meth:`extra` inputs that are cached tensors never written in place.
    ``reusable``: a later predict call with the same options on the same model may use this plan
    again (the predictor's repeat of a call's signature) - its methods change nothing in it, and
    making it changed nothing outside it; False (the default): each call makes its own.
    """

    tag: tuple = ()
    host: bool = False
    reusable: bool = False
    #: the call's ``cuda_graph`` mode and autocast dtype (None: float32), set by the predictor
    #: before :meth:`results`, for plans that run a further stage there through the model's
    #: runner under the same policy as the first (OCR recognition)
    mode: Any = False
    amp_dtype: Any = None

    def finish(self, outputs: Any, *extra: torch.Tensor) -> Any:
        """``model.infer`` outputs (+ :meth:`extra` inputs) -> the stage's outputs (graph-safe)."""
        return outputs

    def to_source(self, outputs: Any, hw: tuple[int, int]) -> Any:
        """The stage's outputs mapped back to the source images' size ``hw``; called inside the
        stage that starts from uint8 images (all of one size there, part of the graph's key),
        after :meth:`finish`. Default: unchanged (the task maps back in :meth:`results`)."""
        return outputs

    def extra(self, shapes: tuple[tuple[int, int], ...], size: int) -> tuple[torch.Tensor, ...]:
        """Device tensors the stage reads besides the images, for a chunk of images of ``shapes``."""
        return ()

    @property
    def constant(self) -> tuple[int, ...]:
        return ()

    def parity_stages(self, batch: int, device: torch.device) -> list[tuple[str, Callable[..., Any], tuple, tuple]]:
        """Stages this plan runs besides the first (from :meth:`results`), for the parity protocol
        (``libreyolo verify``): (name, function, probe A inputs, probe B inputs) each."""
        return []

    def results(self, out: Any, chunk: Sequence[Any], size: int, speed: dict[str, float]) -> list:
        """The stage's outputs for ``chunk`` (:class:`~libreyolo.data.sources.SourceItem` list) ->
        one Results per image."""
        raise NotImplementedError


@dataclass
class TaskOptions:
    """Base of a task's training options (augmentation, validation thresholds, ...)."""

    @classmethod
    def names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def check(self) -> None:
        """Validate (and canonicalise in place) the options; raise OptionError naming a bad one."""



class InStageSelection:
    """The two extra inputs of a stage that runs the in-graph NMS and selection (detection,
    instance segmentation, pose: their plans' ``post`` set, on CUDA with Triton): the thresholds
    ``[conf, iou]`` and each image's letterbox geometry rows, device tensors cached by the
    predictor (``constants``) and never written in place (:attr:`constant`). Mixed in before
    :class:`PredictPlan`."""

    post: Any = None
    conf: float
    iou: float | None            # None: the head has no NMS (the walk does not read it)
    model: Any
    constants: Callable[..., torch.Tensor]

    @property
    def constant(self) -> tuple[int, ...]:
        return (1, 2) if self.post is not None else ()   # the cached thresholds and geometry

    def extra(self, shapes: tuple[tuple[int, int], ...], size: int) -> tuple[torch.Tensor, ...]:
        if self.post is None:
            return ()
        conf, iou = self.conf, 0.0 if self.iou is None else self.iou
        resize = self.model.preprocess.resize
        thr = self.constants("thr", (conf, iou), lambda: [conf, iou])
        geo = self.constants("geo", (shapes, size, resize), lambda: geometry_rows(shapes, size, resize))
        return thr, geo

class Task:
    """Base of the tasks; see the module docstring for what each hook is for."""

    name: ClassVar[str] = ""
    #: the metric (a key of :meth:`Evaluator.evaluate`'s dict) that names the best checkpoint
    primary_metric: ClassVar[str] = ""
    #: the task's training options dataclass (routed there by ``TrainConfig.from_kwargs``)
    Options: ClassVar[type[TaskOptions]] = TaskOptions
    #: predict options this task takes, with their defaults (validated by :meth:`plan`)
    predict_defaults: ClassVar[dict[str, Any]] = {}
    #: ``model.val()`` option names -> the training option they set (detection: conf -> val_conf)
    val_option_names: ClassVar[dict[str, str]] = {}

    # ---------------------------------------------------------------- predict
    def plan(self, model, size: int, constants: Callable[..., torch.Tensor], **opts) -> PredictPlan:
        """The :class:`PredictPlan` of one call with the task's predict options ``opts``.
        ``constants(kind, key, values)`` returns a cached float32 device tensor."""
        raise NotImplementedError

    def predictor(self, model) -> Any:
        """The predictor of this task's models, for a task whose predict is not one stage (None:
        the engine's :class:`~libreyolo.engine.predictor.Predictor` with :meth:`plan`)."""
        return None

    def verify_cases(self, model, size: int, batch: int, source_hw: tuple[int, int]) -> list[tuple] | None:
        """``(name, fn, probe_a, probe_b)`` the parity protocol runs for a task with its own
        predictor (None: ``libreyolo verify``'s network / predict-stage / +post cases)."""
        return None

    def bench_options(self, model: Any = None) -> dict[str, Any]:
        """Predict options ``libreyolo bench``'s end-to-end arms pass for ``model`` (besides
        detection's conf)."""
        return {}

    def bench_setup(self, model, imgsz: int) -> tuple[Any, dict[str, Any], dict[str, Any] | None]:
        """``libreyolo bench``'s input when none is given: (image or None for the bundled sample,
        predict options it needs, notes for the JSON or None). OCR: a printed page."""
        return None, {}, None

    def bench_arms(self, model, image, runs: int, warmup: int, imgsz: int, time_call) -> dict[str, Any]:
        """Task-specific arms of ``libreyolo bench`` (name -> ``time_call`` result or a value)."""
        return {}

    # ------------------------------------------------------------------- data
    def resolve_data(self, data: Any):
        """A dataset spec (a YAML path or a built-in name) -> an object with ``nc``, ``names``,
        ``train`` and ``val`` (what :meth:`datasets` takes)."""
        raise NotImplementedError

    def val_dataset(self, data: Any, imgsz: int, model, options: TaskOptions) -> tuple[Any, Callable]:
        """(val dataset, collate) alone, for ``model.val``; a task whose training split is costly to
        open (labels parsed, images listed) overrides this so that validation never reads it.
        Default: :meth:`datasets`' val dataset and collate."""
        _, val, collate = self.datasets(data, imgsz, model, options)
        return val, collate

    def prepare_model(self, model, data: Any) -> None:
        """Adapt ``model`` to the resolved dataset before its network is used for training or
        validation (pose: an untrained model takes the dataset's keypoint count). Default: nothing."""

    def prepare_training(self, model, net: torch.nn.Module, options: TaskOptions) -> None:
        """Training-only settings of ``net`` from the task's options, before the first step (pose:
        the keypoint branch's gradient scale). Default: nothing."""

    def datasets(self, data: Any, imgsz: int, model, options: TaskOptions) -> tuple[Any, Any, Callable]:
        """(train dataset, val dataset, collate) for ``data`` at ``imgsz``; the collate gives
        ``(images uint8 (B, 3, S, S), *targets)``."""
        raise NotImplementedError

    def device_augment(self, train_set: Any, options: TaskOptions) -> Callable[..., tuple] | None:
        """The augmentation the trainer runs on each batch once it is on the device (before the
        step, outside any captured graph), with ``seed(seed, epoch)`` called before each epoch;
        None (the default) when the loader's batches are final."""
        return None

    def target_rows(self, targets: Sequence[torch.Tensor]) -> int | None:
        """How many rows the batch's targets (after the images, on the device) are padded to,
        where that varies from batch to batch; None (the default) when the targets' shapes are
        fixed. A distributed run pads every rank's batch to the largest count of the ranks
        (:meth:`pad_target_rows`), so the ranks run the same shapes and capture at the same steps."""
        return None

    def pad_target_rows(self, targets: Sequence[torch.Tensor], rows: int) -> list[torch.Tensor]:
        """``targets`` padded to ``rows`` rows (at least :meth:`target_rows`); the loss must not
        see the padding."""
        return list(targets)

    def on_epoch(self, train_set: Any, epoch: int, epochs: int, options: TaskOptions) -> str | None:
        """Called before each epoch, before its loader starts - which is before the previous
        epoch's validation, so that the loader's workers fetch the epoch's first batches while it
        validates (a change here must concern the training data only); returns a line saying
        what changed from this epoch on (logged at the epoch's start), else None. The training
        step's graphs are kept: they start at the batch, after the data pipeline."""
        return None

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: TaskOptions) -> Evaluator:
        raise NotImplementedError

    def evaluation_pool(self, processes: int) -> Any:
        """Helper processes (started now, ended by their ``close()``) that a training run's
        evaluators use for every validation (``Evaluator.pool``), or None: the task's
        evaluation is not worth spreading (the default). Their figures must equal the
        in-process evaluation's exactly."""
        return None

    def fitness(self, metrics: dict[str, float]) -> float:
        """The number ``best.pt`` maximises."""
        v = metrics.get(self.primary_metric)
        return 0.0 if v is None or v != v else float(v)

    def metric_columns(self, metrics: dict[str, float]) -> dict[str, float]:
        """``results.csv`` columns of one epoch's metrics."""
        return {f"metrics/{k}": v for k, v in metrics.items()}

    def empty_metrics(self) -> dict[str, float]:
        """The metrics of an epoch without validation."""
        return {self.primary_metric: float("nan")}

    def summary(self, metrics: dict[str, float]) -> str:
        """The metrics part of the per-epoch log line."""
        return "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))

    # ------------------------------------------------------------------ loss
    def build_loss(self, model) -> torch.nn.Module:
        """The loss module of a family that does not bring its own (``Model.build_loss``)."""
        raise NotImplementedError(f"training is not implemented for the {model.FAMILY} family yet")
