"""The family-independent model wrapper: declarations + thin entry points.

A family subclasses :class:`Model`, declares what it is (``FAMILY``, ``SIZES``, ``TASK``,
``FILE_PREFIX``, ``PREPROCESS``, ``SUPPORTS_CUDA_GRAPH``) and implements three hooks:
``build_network(size, nc)``, ``infer(x)`` (network input -> fixed-shape outputs, the part that
gets captured) and, if needed, ``sniff_size(state_dict)``. Everything else - predict, train,
val, checkpoints, graphs - is shared: the task object (``libreyolo/tasks``) says what is
task-specific, ``engine/`` runs the loops and ``graphs/`` captures.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..device import require_torch_pair, select_device
from ..graphs.runner import GraphRunner
from ..ops.preprocess import Preprocess
from ..tasks import Task, get_task
from ..threads import apply_threads
from .common.names import default_names, normalize_names

log = logging.getLogger(__name__)
# libreyolo.threads is imported with the models: it notes torch's thread count before any run

SCHEMA_VERSION = "1.0"

#: layers whose training mode changes what they compute from the batch (running statistics,
#: random masks); :func:`train_format` keeps them in eval mode
_EVAL_LAYERS = (nn.modules.batchnorm._NormBase, nn.modules.dropout._DropoutNd)


@contextlib.contextmanager
def train_format(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` and its submodules in training mode - so that heads give their training-format
    outputs (logits, auxiliary outputs) - except normalization and dropout layers, which stay in
    eval mode (no running statistic changes, nothing random). Every module's mode is restored on
    exit. Used for validation losses: the training loss of the evaluated weights."""
    modes = [(m, m.training) for m in module.modules()]
    try:
        for m, _ in modes:
            m.training = not isinstance(m, _EVAL_LAYERS)
        yield module
    finally:
        for m, mode in modes:
            m.training = mode


class Model:
    """A vision model: its network (``.model``) plus pre/post-processing and graphs."""

    #: the device the network is on (set in __init__, moved by ``to``)
    device: torch.device
    #: set once the untrained-model warning has been given (absent until then)
    _warned_untrained: bool

    FAMILY: ClassVar[str] = ""
    TASK: ClassVar[str] = "detect"
    SIZES: ClassVar[tuple[str, ...]] = ()
    FILE_PREFIX: ClassVar[str] = ""
    SUPPORTS_CUDA_GRAPH: ClassVar[bool] = False
    SUPPORTS_CUDA_GRAPH_TRAIN: ClassVar[bool] = False
    #: the training step cannot be one graph, but a fixed-shape front part of the network can
    #: (forward and backward captured, the rest eager): see :meth:`train_seam`
    SUPPORTS_CUDA_GRAPH_TRAIN_SEAM: ClassVar[bool] = False
    #: optimizers whose update the whole-step capture includes for this family (its step-0 update
    #: equals eager's within eager's own noise); with another the trainer captures forward+backward only
    WHOLE_STEP_OPTIMIZERS: ClassVar[tuple[str, ...]] = ("sgd",)
    #: train in channels_last on CUDA by default (``channels_last=None``): convolution networks
    #: whose BatchNorm and convolutions run faster in NHWC and whose ops accept any layout
    CHANNELS_LAST: ClassVar[bool] = False
    #: classes of a model built without ``nc`` (the label set the family's checkpoints use)
    DEFAULT_NC: ClassVar[int] = 80
    #: predict captures only the front of the network (preprocessing + :meth:`infer_front`) and
    #: runs the rest (:meth:`infer_back`, the task's post-processing) eager: for a family with an op
    #: that is not bitwise capturable, shown by a GPU test; ``SUPPORTS_CUDA_GRAPH`` then vouches
    #: for the front part
    PREDICT_SEAM: ClassVar[bool] = False
    #: the parity protocol's re-drawn probe weights are rescaled to unit activations on a
    #: calibration pass (:meth:`calibration_pass`; engine/verify.py: input_sensitive)
    REDRAW_CALIBRATE: ClassVar[bool] = False
    STRIDE: ClassVar[int] = 32
    DEFAULT_IMGSZ: ClassVar[int] = 640
    #: sizes whose default input size is not ``DEFAULT_IMGSZ`` (the size each was trained at)
    DEFAULT_IMGSZ_BY_SIZE: ClassVar[dict[str, int]] = {}
    UNSUPPORTED_REASON: ClassVar[str | None] = None
    #: how images reach the network (resize mode, normalization), as the family was trained; a
    #: checkpoint's ``preprocess`` metadata overrides it (see :mod:`libreyolo.ops.preprocess`)
    PREPROCESS: ClassVar[Preprocess] = Preprocess("topleft")
    #: training options this family's original recipe uses, under whatever the caller passes
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {}
    #: autocast dtype of ``amp=True`` (predict) and of the parity protocol's AMP arm
    AMP_DTYPE: ClassVar[torch.dtype] = torch.float16
    #: False for set-prediction heads (DETRs): their top-k outputs need no NMS, only ``conf``/``max_det``
    NMS: ClassVar[bool] = True
    #: the family's variants serving other tasks: task -> ``module:Class`` under libreyolo.models (a
    #: checkpoint's ``task`` metadata, or ``new(..., task=...)``, picks the class)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {}

    # ------------------------------------------------------------ family hooks
    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        raise NotImplementedError(f"{cls.__name__} must implement build_network")

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Letterboxed float batch -> fixed-shape outputs (the capturable part)."""
        raise NotImplementedError(f"{type(self).__name__} must implement infer")

    def infer_front(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """With ``PREDICT_SEAM``: the captured side, network input -> fixed-shape tensors."""
        raise NotImplementedError(f"{type(self).__name__} declares no predict seam")

    def infer_back(self, *front: torch.Tensor) -> Any:
        """With ``PREDICT_SEAM``: the eager side, :meth:`infer_front`'s outputs -> what
        :meth:`infer` returns (``infer_back(*infer_front(x))`` equals ``infer(x)`` bit for bit)."""
        raise NotImplementedError(f"{type(self).__name__} declares no predict seam")

    @property
    def task(self) -> str:
        """The task's name as text (``"detect"``, ``"classify"``, ...): ``TASK``."""
        return self.TASK

    @property
    def task_def(self) -> Task:
        """The task object (``libreyolo.tasks``) this family's ``TASK`` names: what the engine's
        loops call for everything task-specific (loss, datasets, predict plan, evaluator)."""
        return get_task(self.TASK)

    @property
    def nb_classes(self) -> int:
        """The class count (``nc``), under the name the library this one replaces uses."""
        return self.nc

    def build_loss(self) -> nn.Module:
        """The family's training loss module (default: the task's).

        Contract: ``loss(outputs, *targets) -> (loss, items)`` where ``outputs`` is what
        :meth:`train_forward` returns and ``targets`` what the task's collate gives after the
        images (detection: ``targets`` float (B, M, 5) ``[cls, x1, y1, x2, y2]`` in input pixels
        padded to M rows and ``mask`` bool (B, M) marking the real rows); ``items`` is a detached
        1-D tensor named by the module's ``item_names`` tuple. An optional ``on_epoch(epoch,
        epochs) -> bool`` returns True when what it computes changes from that epoch on (the
        trainer then releases its captured training graphs).
        """
        return self.task_def.build_loss(self)

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """Training-mode forward: ``x`` is the (B, 3, S, S) normalized network input, ``targets``
        the task's (families whose training forward needs them, e.g. DETR denoising, use them).
        Returns what ``build_loss()``'s module takes as its first argument."""
        return net(x)

    def val_loss_outputs(self, net: nn.Module, out: Any, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """What the loss takes (:meth:`train_forward`'s format) for a validation batch, for the
        validation loss. ``out`` is ``net``'s eval-mode output on ``x`` (recorded while
        :meth:`infer` ran; ``x`` the normalized input, ``targets`` the task's, on the device).
        Default: ``out`` itself, for networks whose output format does not depend on their mode
        (only normalization and dropout differ). Families whose training forward gives other
        outputs override this: from ``out`` when it holds them, else by a second pass under
        :func:`train_format`."""
        return out

    #: (module prefix, first channel, channel count or None for all) of the class/objectness
    #: logit convs that get the 1 % prior bias when training starts from random weights
    PRIOR_BIAS: ClassVar[tuple[tuple[str, int, int | None], ...]] = ()

    def init_for_training(self, net: nn.Module, prior: float = 0.01) -> int:
        """Before training an UNTRAINED network: class/objectness logit biases to logit(prior),
        as the original recipes do (the loss then starts near its usual scale). Returns how many
        convs were touched. Trained weights are never modified."""
        return self._prior_bias(net, self.PRIOR_BIAS, prior)

    @staticmethod
    def _prior_bias(net: nn.Module, specs, prior: float) -> int:
        logit = math.log(prior / (1 - prior))
        touched = 0
        with torch.no_grad():
            for name, mod in net.named_modules():
                for prefix, start, count in specs:
                    if name.startswith(prefix) and isinstance(mod, nn.Conv2d) and mod.bias is not None:
                        mod.bias[start:None if count is None else start + count] = logit
                        touched += 1
        return touched

    def train_seam(self, net: nn.Module) -> nn.Module | None:
        """The fixed-shape front part of ``net`` whose forward+backward may be captured while the
        rest of the training step runs eager (None: the family has no seam)."""
        return None

    def set_train_seam(self, net: nn.Module, segment: nn.Module | None) -> None:
        """Make ``net``'s training forward run its front part through ``segment`` (None: directly)."""
        raise NotImplementedError(f"{self.FAMILY} has no training seam")

    def infer_with(self, net: nn.Module):
        """``infer`` for another network of this family (e.g. the EMA copy during training)."""
        twin = copy.copy(self)
        twin.model = net
        return twin.infer

    def reset_classes(self, nc: int, names: Any = None) -> None:
        """Rebuild the network for ``nc`` classes, keeping every weight whose shape still fits."""
        new = self.build_network(self.size, nc)
        old, fresh = self.model.state_dict(), new.state_dict()
        keep = {k: v for k, v in old.items() if k in fresh and fresh[k].shape == v.shape}
        new.load_state_dict(keep, strict=False)
        new.train(self.model.training)   # a fresh module is in training mode; keep the old one's
        self._attach(new.to(self.device))
        self.nc = int(nc)
        self.names = self.default_names(self.nc) if names is None else normalize_names(names, self.nc)

    def _attach(self, net: nn.Module) -> None:
        """Make ``net`` this model's network, with a fresh graph runner and predictor."""
        self.model = net
        self.runner = GraphRunner(net, self.FAMILY, self.SUPPORTS_CUDA_GRAPH,
                                  unsupported_reason=self.UNSUPPORTED_REASON)
        self._predictor = None
        self._half_networks: dict = {}   # precision="fp16"/"bf16" copies (engine/fastpath.py)

    @classmethod
    def sniff_size(cls, state_dict: dict[str, torch.Tensor], nc: int) -> str | None:
        """The size whose parameter shapes match ``state_dict`` (built on the meta device)."""
        for size in cls.SIZES:
            with torch.device("meta"):
                net = cls.build_network(size, nc)
            ref = net.state_dict()
            if ref.keys() == state_dict.keys() and all(
                    ref[k].shape == state_dict[k].shape for k in ref):
                return size
        return None

    #: state-dict keys that only this family's layout has (checkpoint sniffing)
    SIGNATURE_KEYS: ClassVar[tuple[str, ...]] = ()
    #: the class-logit weight whose first dimension is nc (+ NC_EXTRA_CHANNELS)
    NC_KEY: ClassVar[str | None] = None
    NC_EXTRA_CHANNELS: ClassVar[int] = 0

    @classmethod
    def owns_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        """Whether the keys are this family's (its own layout or one of its task variants')."""
        return cls._owns_own(state_dict) or any(v._owns_own(state_dict) for v in cls.task_variants())

    @classmethod
    def _owns_own(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        return bool(cls.SIGNATURE_KEYS) and all(k in state_dict for k in cls.SIGNATURE_KEYS)

    @classmethod
    def task_variants(cls) -> list[type[Model]]:
        """The classes of ``TASK_VARIANTS`` (imported on use)."""
        import importlib
        out = []
        for spec in cls.TASK_VARIANTS.values():
            mod, name = spec.split(":")
            out.append(getattr(importlib.import_module(mod, __package__), name))
        return out

    @classmethod
    def for_task(cls, task: str | None) -> type[Model]:
        """This family's class serving ``task`` (None: this class); an error lists the tasks it serves."""
        if task is None or task == cls.TASK:
            return cls
        for variant in cls.task_variants():
            if variant.TASK == task:
                return variant
        served = [cls.TASK] + [v.TASK for v in cls.task_variants()]
        raise ValueError(f"the {cls.FAMILY} family serves the tasks {', '.join(served)}, not {task!r}")

    @classmethod
    def nc_from_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> int | None:
        w = state_dict.get(cls.NC_KEY) if cls.NC_KEY else None
        if w is None:
            return None
        nc = int(w.shape[0]) - cls.NC_EXTRA_CHANNELS
        return nc if nc > 0 else None

    # ------------------------------------------------------------ construction
    def __init__(self, net: nn.Module, *, size: str, nc: int, names: Any = None,
                 imgsz: int | None = None, device: Any = "auto", trained: bool = True,
                 source: str | None = None, meta: dict | None = None):
        self.size = size
        self.nc = int(nc)
        self.names = self.default_names(self.nc) if names is None else normalize_names(names, self.nc)
        self.imgsz = int(imgsz or self.DEFAULT_IMGSZ_BY_SIZE.get(size) or self.DEFAULT_IMGSZ)
        self.trained = trained
        self.source = source
        #: the checkpoint file whose weights the model holds (after ``train``: the run's best.pt)
        self.ckpt_path: str | None = source if source is not None and Path(source).is_file() else None
        self.meta = dict(meta or {})
        default = self.preprocess_for(size)
        self.preprocess = (Preprocess.from_meta(self.meta["preprocess"], default)
                           if self.meta.get("preprocess") is not None else default)
        self.fused = False
        self.device = select_device(device)
        self._attach(net.to(self.device).eval())

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        """Class names of a model built without any (the task's usual label set where ``nc``
        is its size: COCO's 80 for detection; ``class0``, ``class1``... otherwise)."""
        return default_names(nc)

    @classmethod
    def new(cls, size: str, nc: int | None = None, names: Any = None, *, imgsz: int | None = None,
            device: Any = "auto", seed: int | None = None, task: str | None = None) -> Model:
        """An untrained (randomly initialised) model, built explicitly from its size; ``nc``
        defaults to the family's usual label set (``DEFAULT_NC``: 80 for detection, ImageNet's
        1000 for the classifiers, ADE20K's 150 for SegFormer). ``task`` picks the family's
        variant for that task (default: the family's own task)."""
        if task is not None and task != cls.TASK:
            return cls.for_task(task).new(size, nc=nc, names=names, imgsz=imgsz, device=device, seed=seed)
        if size not in cls.SIZES:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        from ..options import check_imgsz, check_int, check_seed
        nc = check_int("nc", cls.DEFAULT_NC if nc is None else nc, 1)
        if imgsz is not None:   # a size predict would refuse is refused here (and 0 is not 'the default')
            imgsz = check_imgsz(imgsz)
        if seed is not None:
            torch.manual_seed(check_seed(seed))
        return cls(cls.build_network(size, nc), size=size, nc=nc, names=names, imgsz=imgsz,
                   device=device, trained=False, source=f"untrained {cls.FAMILY}-{size}")

    @classmethod
    def from_checkpoint(cls, ckpt: dict, *, size: str | None = None, device: Any = "auto",
                        source: str | None = None) -> Model:
        sd = ckpt["model"]
        task = ckpt.get("task")
        if cls.TASK_VARIANTS:   # the checkpoint's task (else its keys) picks the family's variant
            if task in cls.TASK_VARIANTS:
                return cls.for_task(task).from_checkpoint(ckpt, size=size, device=device, source=source)
            if task is None and not cls._owns_own(sd):
                for variant in cls.task_variants():
                    if variant._owns_own(sd):
                        return variant.from_checkpoint(ckpt, size=size, device=device, source=source)
        from ..compat import checkpoint_task
        if task is not None and task not in (cls.TASK, checkpoint_task(cls.TASK)):
            from ..tasks import TASKS
            if task in set(TASKS):   # a task we know (names only: no task is imported) that this family does not serve
                served = [cls.TASK] + [v.TASK for v in cls.task_variants()]
                raise ValueError(f"{source or 'checkpoint'}: its task is {task!r}, but the {cls.FAMILY} family "
                                 f"here serves {', '.join(served)}: it would load as a model of another task")
        nc = int(ckpt.get("nc") or cls.nc_from_state_dict(sd) or 80)
        size = ckpt.get("size") or size or cls.sniff_size(sd, nc)
        if size is None:
            raise ValueError(f"{source or 'checkpoint'}: its tensors match no {cls.FAMILY} size "
                             f"({', '.join(cls.SIZES)}) with nc={nc}")
        if size not in cls.SIZES:
            raise ValueError(f"{source or 'checkpoint'}: unknown {cls.FAMILY} size {size!r}")
        net = cls.build_network(size, nc)
        load_strict(net, sd, f"{cls.FAMILY}-{size}", source)
        meta = {k: v for k, v in ckpt.items() if k not in ("model", "train_state")}
        return cls(net, size=size, nc=nc, names=ckpt.get("names"), imgsz=ckpt.get("imgsz"),
                   device=device, trained=True, source=source, meta=meta)

    def info(self, imgsz: int | None = None, verbose: bool = True) -> dict:
        """Layers, parameters, GFLOPs at ``imgsz`` (default the model's), task and graph support;
        printed as one line with ``verbose``."""
        from .summary import format_summary, model_summary
        d = model_summary(self.model, int(imgsz or self.imgsz), self.TASK, self.FAMILY, self.size,
                          self.SUPPORTS_CUDA_GRAPH)
        if verbose:
            print(format_summary(d))
        return d

    @classmethod
    def preprocess_for(cls, size: str) -> Preprocess:
        """The preprocessing of ``size`` (``PREPROCESS`` unless a family's sizes differ)."""
        return cls.PREPROCESS

    @property
    def resize(self) -> str:
        """How images are resized for the network (``preprocess.resize``)."""
        return self.preprocess.resize

    # ---------------------------------------------------------------- plumbing
    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        state = "trained" if self.trained else "UNTRAINED"
        return (f"{type(self).__name__}({self.FAMILY}-{self.size}, task={self.TASK}, nc={self.nc}, "
                f"params={n:,}, device={self.device}, {state}{', fused' if self.fused else ''})")

    def to(self, device: Any) -> Model:
        """Move the model; graphs of the old placement are released (with the weights they hold)."""
        new = select_device(device)
        if new != self.device:
            self.runner.release()
        self.device = new
        self.model.to(self.device)
        return self

    def cpu(self) -> Model:
        return self.to("cpu")

    def cuda(self, index: int = 0) -> Model:
        return self.to(f"cuda:{index}")

    def fuse(self) -> Model:
        """Fold BatchNorm into convolutions and re-parameterize Rep blocks (inference only).

        Stale graphs are released automatically (the parameter fingerprint changes).
        """
        if not self.fused:
            self.fuse_network(self.model)
            self.model.to(self.device).eval()
            self.fused = True
        return self

    def fuse_network(self, net: nn.Module) -> None:
        """Fold ``net`` in place for :meth:`fuse`: the network's own ``fuse()``; a family whose
        networks have none (timm's classifiers) overrides this."""
        fuse = getattr(net, "fuse", None)
        if fuse is None:
            raise NotImplementedError(f"{self.FAMILY} has no fuse()")
        fuse()

    def checkpoint(self) -> dict:
        """The LibreYOLO checkpoint dict of this model (CPU tensors)."""
        return self.checkpoint_of(self.model)

    def checkpoint_of(self, net: nn.Module, host: bool = True) -> dict:
        """The LibreYOLO checkpoint dict for ``net`` with this model's metadata: its weights
        copied to host memory, contiguous. ``host=False`` leaves them the network's own tensors,
        for a caller that copies everything at once (:class:`~libreyolo.weights.PackedSnapshot`)."""
        if self.fused:
            raise ValueError("a fused model cannot be saved in the LibreYOLO layout (BatchNorm was folded "
                             "away); save before calling fuse()")
        from .. import __version__
        from ..compat import checkpoint_task
        from ..weights import state_dict_copies
        sd = state_dict_copies(net, host)
        ckpt = {"model": sd, "schema_version": SCHEMA_VERSION, "libreyolo_version": __version__,
                "model_family": self.FAMILY, "size": self.size, "task": checkpoint_task(self.TASK), "nc": self.nc,
                "names": dict(self.names), "imgsz": self.imgsz, "preprocess": self.preprocess.as_dict()}
        if self.preprocess.resize in ("topleft", "center"):
            ckpt["letterbox_pad"] = self.preprocess.resize   # LibreYOLO's detection checkpoint field
        for k, v in self.meta.items():
            ckpt.setdefault(k, v)
        return ckpt

    def push_to_hub(self, repo_id: str, *, revision: str | None = None, private: bool | None = None,
                    token: str | None = None, commit_message: str | None = None, exist_ok: bool = True) -> Any:
        """Publish this model to the Hugging Face hub repo ``repo_id`` (created when missing):
        the weights as ``model.safetensors`` and a model card (``README.md``) with the training
        metrics and the exact preprocess record; ``LibreYOLO(repo_id)`` loads it back. See
        :func:`libreyolo.hub.push_to_hub`.

        Args:
            repo_id: the repo, owner/name
            revision: the branch to commit to (default: the repo's main branch)
            private: make a new repo private
            token: a write token (default: huggingface_hub's, HF_TOKEN or hf auth login)
            commit_message: the commit's message
            exist_ok: False refuses a repo that exists already

        Returns:
            huggingface_hub's CommitInfo (commit_url, oid).
        """
        from ..hub import push_to_hub
        return push_to_hub(self, repo_id, revision=revision, private=private, token=token,
                           commit_message=commit_message, exist_ok=exist_ok)

    def save(self, path: str | Path) -> Path:
        """Write the checkpoint atomically (temp file + rename); returns the path."""
        from ..weights import save_checkpoint
        return save_checkpoint(self.checkpoint(), path)

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> Model:
        """Load new weights in place (stale graphs are released automatically)."""
        load_strict(self.model, state_dict, f"{self.FAMILY}-{self.size}", None)
        self.trained = True
        return self

    # ------------------------------------------------------------------ graphs
    def capture_graph(self, imgsz: int | None = None, batch: int = 1, dtype: torch.dtype | None = None,
                      source: Any = None, source_shape: tuple[int, int] | None = None,
                      precision: Any = None, fast: Any = False, **opts) -> dict:
        """Capture now what predict will replay, so the first request pays no capture.

        With ``source`` (an image, a path, anything predict takes) or ``source_shape`` (h, w): the
        whole stage from uint8 images of that size (preprocessing, network, post-processing).
        Without: the stage from the preprocessed (batch, 3, imgsz, imgsz) input, which predict then
        uses for images of every size. ``dtype`` float16/bfloat16 captures under autocast (use
        the same ``amp`` in predict); ``precision`` ("fp16"/"bf16") and ``fast`` capture the half /
        fast path's stage (use the same in predict); ``opts``: the task's predict options predict
        will use (detection: conf/iou are graph inputs, max_det, max_nms and agnostic_nms are not).
        """
        if precision is not None or fast:   # a task predictor of its own need not take them
            opts.update(precision=precision, fast=fast)
        return self.get_predictor().capture(imgsz=imgsz, batch=batch, dtype=dtype, source=source,
                                             source_shape=source_shape, **opts)

    def graph_info(self) -> dict:
        """Family, support, mode, each graph (signature, capture ms, replays), fallbacks, memory."""
        info = self.runner.info()
        info["device"] = str(self.device)
        return info

    def release_graphs(self) -> int:
        """Free every captured graph; returns how many were released."""
        return self.runner.release()

    # ----------------------------------------------------------------- predict
    def get_predictor(self):
        """This model's predictor, built at the first call and kept until the network changes: the
        task's own (:meth:`Task.predictor`, a predict that is not one stage) or
        :class:`~libreyolo.engine.predictor.Predictor`. Predict, track and capture go through it."""
        if self._predictor is None:
            custom = self.task_def.predictor(self)   # a task whose predict is not one stage
            if custom is None:
                from ..engine.predictor import Predictor
                custom = Predictor(self)
            self._predictor = custom
        return self._predictor

    def train_defaults(self) -> dict[str, Any]:
        """This family's (and size's) recipe options, applied under whatever the caller passes."""
        return dict(self.TRAIN_DEFAULTS)

    def train(self, **kwargs) -> dict:
        """Train on ``data`` (a dataset YAML, or a built-in set such as "shapes").

        Options are those of :class:`libreyolo.engine.config.TrainConfig` (epochs, batch, imgsz,
        optimizer, lr0, amp, cuda_graph, resume, ...) and the task's (detection: mosaic, mixup,
        ...). Returns the final and best metrics, the per-epoch losses and metrics, and the paths
        of best.pt / last.pt.

        ``device=[0, 1]`` (or ``"0,1"``) trains on those GPUs: the run is started under torchrun,
        one process per GPU, from this model's current weights, and this model takes the trained
        weights when it ends (see :func:`libreyolo.launch.train_from_python`).

        ``callbacks``: hooks for this run (:class:`~libreyolo.engine.hooks.HookBase` objects, or
        ``{event: fn}`` dicts of functions called with the trainer), after the model's own
        (:meth:`add_callback`); see :meth:`libreyolo.engine.trainer.Trainer.register_hooks`.

        An option left out (or None) takes the family's recipe value (:meth:`train_defaults`), else
        its default. The task's options apply to that task's models only.

        Args:
            data: dataset YAML (YOLO or COCO format), a dataset folder, or a built-in set by name (e.g. shapes);
                required (default: none)
            epochs: training epochs
            batch: batch size (several GPUs: the global batch)
            imgsz: training size (default: the family's, e.g. 640 for detectors, 224 for classifiers)
            device: auto, cpu, cuda, cuda:1; several GPUs (0,1) train one process per GPU under torchrun
            workers: DataLoader workers (default: auto, up to 8 on CUDA and 2 on the CPU, capped by the cores, the
                batches and the memory)
            val: validate after every epoch (false: no validation, best.pt = last.pt)
            project: where runs are written
            name: run name (the run folder is project/name, numbered when it exists)
            exist_ok: reuse the run folder
            resume: true (this run's last.pt) or the path of a last.pt
            cache: ram or disk: decode and resize every image once, before the first epoch; auto (default): in RAM
                when the images need at most a quarter of the free memory and 4 GiB; false: read the files every
                epoch
            seed: random seed (initial weights, data order, augmentation)
            plots: write the run's pictures (curves, labels, validation batches)
            verbose: progress bars and per-epoch lines
            patience: stop after N epochs without a better validation fitness (0: never)
            freeze: freeze the first N layers, or parameter-name prefixes, e.g. freeze=3 or
                freeze=backbone,neck.down1
            save_period: also save weights/epochN.pt every N epochs (0: never)
            loggers: experiment loggers, comma-separated: tensorboard (event files in the run folder), mlflow,
                wandb, comet, clearml, dvclive (each needs its package)
            sync_bn: several GPUs: BatchNorm statistics over the global batch (SyncBatchNorm)
            ddp_timeout: several GPUs: seconds a rank waits for the others before the run stops with an error
            nan_patience: stop after N epochs in a row with a non-finite loss
            optimizer: SGD or AdamW (default: the family's recipe, SGD for the YOLO families)
            lr0: initial learning rate (default: the family's, else 0.01 SGD, 0.001 AdamW)
            lrf: final learning rate as a fraction of lr0
            momentum: SGD momentum / Adam beta1
            weight_decay: weight decay (of the weights, not of BatchNorm or biases)
            clip_grad: largest gradient norm (YOLO recipes 10, DETR recipes 0.1)
            warmup_epochs: epochs of linear warm-up (fractions allowed)
            warmup_momentum: momentum at the start of the warm-up
            warmup_bias_lr: learning rate of the biases at the start of the warm-up
            cos_lr: cosine instead of linear decay
            nbs: nominal batch: gradients accumulate up to it
            ema: keep an exponential moving average of the weights (what is validated and saved)
            cuda_graph: capture the training step in CUDA graphs (eager fallback, one log line)
            amp: autocast on CUDA: true (float16 with a GradScaler), fp16, bf16 (no scaler) or false
            channels_last: NHWC network and batches: true, false or auto (on CUDA for the families that declare it)
            prefetch_next_epoch: start the next epoch's loader before this epoch's validation and checkpoints
            prefetch_validation: start the validation loader's workers before the epoch's last step
            loss_lag: steps the loop reads a step's loss behind (0: each step waited for; the same numbers)
            switch_interval: the interpreter's thread switch interval during the run, seconds (default: Python's 5
                ms)
            join_write_before_validation: wait for the previous checkpoint write before validating (default: only
                when this process writes)
            freeze_heap: leave the objects alive when the epochs start out of the garbage collector's full
                collections
            checkpoint_process: write checkpoints from a child interpreter (default: on CUDA runs)
            eval_processes: helper processes for the validations' evaluation, below 2: none (default: a quarter of
                the cores, at most 4)
            val_capturer: validation graph capturer (tests)
            threads: torch's intra-op threads on the CPU (default: from the cores this process can get)
            close_mosaic: detection: epochs at the end trained without mosaic and MixUp (default: the family's, else
                10)
            mosaic: detection: probability of mosaic (default: the family's, else 1; DETRs 0)
            dense_mosaic: detection: DEIM's Dense O2O: mosaic tiles shrunk so each image holds all four
            mixup: detection: probability of MixUp, blending two augmented samples (default: the family's, else 0;
                closed with mosaic); classification: MixUp's Beta alpha, 0 = off (ImageNet recipes: 0.8)
            augment_policy: detection: yolo (affine + HSV) or detr (photometric, zoom-out, IoU crop); default: the
                family's
            degrees: detection: random rotation, +- degrees
            translate: detection: random translation, +- fraction of the size
            scale: detection: random scale gain, +- fraction; classification: RandomResizedCrop's smallest area
                fraction (ImageNet from scratch: 0.08)
            fliplr: detection, classification, semantic segmentation, depth: probability of a horizontal flip
            hsv_h: detection: hue augmentation, +- fraction
            hsv_s: detection: saturation augmentation, +- fraction
            hsv_v: detection: value (brightness) augmentation, +- fraction
            bucket: detection: targets padded to this times a power of two (fixed loss shapes)
            gpu_augment: detection: the YOLO recipe (mosaic, affine, HSV, flip) on the training device per batch,
                the workers only decode (augment_policy=yolo only)
            val_conf: detection: confidence threshold of validation
            val_iou: detection: NMS IoU threshold of validation
            max_det: detection: detections kept per image in validation
            val_mask_threshold: panoptic: mask probability of a segment's pixels in validation
            val_overlap: panoptic: share of its own mask a query must win in validation
            label_smoothing: classification: eps of the smoothed targets (cross-entropy with label smoothing)
            auto_augment: classification: trivialaugment, randaugment or none (long ImageNet-style runs: on)
            cutmix: classification: CutMix's Beta alpha, 0 = off (ImageNet recipes: 1.0)
            scale_min: semantic segmentation: smallest random scale of the image relative to the network's square
                (SegFormer's ratio range 0.5-2.0), then a random crop
            scale_max: semantic segmentation: largest random scale of the image
            color_jitter: semantic segmentation: brightness / contrast / saturation in [1 - s, 1 + s], hue +- s / 4;
                depth: brightness / contrast / saturation jitter strength
            ignore_index: semantic segmentation: mask value that is not a class (default: the dataset's, else 255)
            flipud: restore: probability of an up-down flip of a training patch pair (fliplr: of a left-right one)
            rot90: restore: probability of a 90-degree turn of a training patch pair
            val_radius: point: a prediction within this many pixels of the network input from a labelled point
                of its class matches it (12: 1.5 cells of FOMO's 8-pixel grid)
            val_nms_radius: point: cells within which validation keeps one peak per class (predict's nms_radius)
            kpt_grad: pose: scale of the keypoint branch's gradient into the features it shares with the boxes
                (YOLO-NAS-Pose; default: the family's, 1 = unscaled)
            callbacks: hooks for this run, HookBase objects or {event: fn} dicts

        Returns:
            dict: the final and best metrics, the per-epoch losses and metrics, the paths of best.pt
            and last.pt.
        """
        from ..distributed import launched, parse_devices
        from ..engine.config import TrainConfig
        from ..engine.hooks import as_hooks
        from ..engine.trainer import Trainer
        from ..launch import train_from_python
        hooks = as_hooks(kwargs.pop("callbacks", None))
        own = getattr(self, "callbacks", None)
        if own:
            from ..engine.hooks import CallbackHook
            hooks.insert(0, CallbackHook(own))
        given = {k: v for k, v in kwargs.items() if v is not None}   # None: "not given", the family decides
        gpus = parse_devices(given.get("device"))
        if gpus is not None and not launched():
            if hooks:
                from ..options import OptionError
                raise OptionError("callbacks run in the training process, and a run on several GPUs started from "
                                  "Python trains in new processes: start it with torchrun from a script that "
                                  "passes them")
            return train_from_python(self, {**given, "device": ",".join(map(str, gpus))}, len(gpus))
        cfg = TrainConfig.from_kwargs(self.task_def, **{**self.train_defaults(), **given})
        return Trainer(self, cfg, hooks).train()

    def add_callback(self, event: str, fn) -> None:
        """Call ``fn(trainer)`` at ``event`` of every later :meth:`train` of this model: one of
        ``before_train``, ``before_epoch``, ``before_step``, ``after_step``, ``after_epoch``,
        ``after_train`` (see :class:`~libreyolo.engine.hooks.HookBase`); another name is a
        ValueError listing them."""
        from ..engine.hooks import check_event
        if not callable(fn):
            raise TypeError(f"the callback for {event!r} must be callable, got {fn!r}")
        if getattr(self, "callbacks", None) is None:
            self.callbacks: dict[str, list] = {}
        self.callbacks.setdefault(check_event(event), []).append(fn)

    def val(self, data: str | None = None, *, imgsz: int | None = None, batch: int = 16, workers: int = 2,
            verbose: bool = False, save_json: bool = False, save_dir: str | Path | None = None,
            threads: int | None = None, **task_opts) -> dict:
        """The task's metrics of the current weights on the dataset's validation split
        (detection: mAP50 / mAP50-95; ``conf`` and ``iou`` set the NMS thresholds).

        ``save_json=True`` (detection) also writes the predictions as COCO results,
        ``predictions.json`` in ``save_dir`` (default: a new ``runs/<task>/val``, ``val2``, ...),
        for external evaluation; its path is returned as ``"predictions_json"``.

        Args:
            data: dataset YAML, a dataset folder, or a built-in set by name (e.g. shapes); required (default: none)
            imgsz: size (default: the model's)
            batch: batch size
            workers: DataLoader workers
            verbose: a progress bar
            save_json: detection: also write the predictions as COCO results (predictions.json)
            save_dir: where predictions.json goes (default: a new runs/<task>/val, val2, ...)
            threads: torch's intra-op threads on the CPU (default: chosen by libreyolo.threads)
            conf: detection: confidence threshold
            iou: detection: NMS IoU threshold
            **task_opts: other training options (TrainConfig's) the evaluation reads, e.g. device, amp,
                cache, seed, max_det

        Returns:
            dict: the task's metrics (detection: mAP50, mAP50-95, per class, ...).
        """
        from ..engine.call_options import ValOptions
        from ..engine.config import TrainConfig
        from ..engine.evaluate import evaluate
        from ..engine.loaders import build_loaders
        from ..engine.setup import check_config, device_settings
        from ..options import check_fields
        # val's own options are checked as the CLI checks them (ValOptions: the same messages); the
        # task's validation options under their val names (detection: conf, iou) go to the
        # training options they set (val_conf, val_iou), other keywords to TrainConfig as given
        names = self.task_def.val_option_names
        own = {k: task_opts.pop(k) for k in list(task_opts) if k in names}
        o = ValOptions(data=data, imgsz=imgsz, batch=batch, workers=workers, verbose=verbose, save_json=save_json,
                       save_dir=save_dir, threads=threads, **own)
        check_fields(o)
        if o.save_json and not self.task_def.evaluator(self, self.task_def.Options()).writes_coco_json:
            raise ValueError(f"save_json=True writes COCO detection results; the {self.TASK} task has no "
                             "COCO results format")
        task_opts.update({names[k]: getattr(o, k) for k in own})
        cfg = TrainConfig(self.task_def, data=data, imgsz=o.imgsz or self.imgsz, batch=o.batch, workers=o.workers,
                          verbose=o.verbose, threads=o.threads, **task_opts)
        require_torch_pair()   # a broken torch/torchvision pair fails before the split is loaded
        ds = self.task_def.resolve_data(data)
        if ds.nc != self.nc:
            raise ValueError(f"the dataset has {ds.nc} classes but the model predicts {self.nc}")
        self.task_def.prepare_model(self, ds)
        check_config(cfg, self.STRIDE)
        device, amp_dtype, channels_last = device_settings(self, cfg)
        apply_threads(cfg.tune.threads, device)
        self.to(device)
        loaders = build_loaders(self.task_def, ds, self, cfg, device, val_only=True)   # the train split unused
        # the evaluation's helper processes (detection: the classes dealt out to them, the same
        # figures) start now and import while the split runs through the network
        pool = self.task_def.evaluation_pool(cfg.tune.processes())
        try:
            result = evaluate(self, loaders.val, options=cfg.task, device=device, amp_dtype=amp_dtype,
                              memory_format=torch.channels_last if channels_last else torch.contiguous_format,
                              pool=pool, progress=verbose, seed=cfg.run.seed)
        finally:
            if pool is not None:
                pool.close()
        metrics = result.metrics
        if o.save_json:
            import json
            import os

            from ..engine.paths import next_run_dir, task_project
            out_dir = Path(save_dir) if save_dir else next_run_dir(task_project(self.TASK), "val")
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / "predictions.json"
            tmp = out_dir / ".predictions.json.tmp"
            with open(tmp, "w") as f:   # then renamed: never a truncated file for the evaluator to read
                json.dump(result.evaluator.coco_predictions(loaders.val_set, ds), f)
            os.replace(tmp, path)
            metrics["predictions_json"] = str(path)
        return metrics

    def predict(self, source: Any, **kwargs) -> Any:
        """Run inference on ``source``; :meth:`libreyolo.engine.predictor.Predictor.__call__` tells
        each option in full. The task's options apply to that task's models only.

        Args:
            source: a path, directory, glob, PIL image, numpy array (BGR unless bgr=False), torch tensor
                (RGB), or a list of them; or a video file, camera index, stream URL or .streams list
            imgsz: inference size (default: the model's)
            batch: images per forward
            cuda_graph: false, true (capture each new input signature) or auto (capture once a signature repeats)
            amp: autocast on CUDA: false, true (the family's dtype), fp16 or bf16
            precision: fp32 (default, bitwise), fp16 or bf16: the half network (fp16 with fast=true)
            fast: CUDA: compile the half network with inductor inside the CUDA graph: true (torch.compile) or aot
                (ahead of time, a package per shape cached on disk)
            decode: image files: cpu (default: PIL), gpu (JPEGs with nvjpeg, batched) or auto (gpu where it can run)
            bgr: numpy images are BGR (default, OpenCV's order); false: RGB
            color_format: numpy images' channel order: bgr (default, OpenCV's) or rgb
            save: write annotated images (a video: an annotated .mp4)
            save_dir: where annotated images go (default: a new runs/<task>/predict, predict2, ...)
            exist_ok: save into runs/<task>/predict itself instead of a new numbered folder
            output_path: with save: a folder for the annotated images (as save_dir), or a file path with a
                suffix for the first one (later ones beside it, numbered)
            output_file_format: with save: the annotated images' format, jpg, png or webp (default: jpg; a
                matte png)
            device: move the model to this device before predicting (e.g. cpu, cuda:0)
            half: accepted and ignored, as LibreYOLO 1.6.0 does (a warning says so); the half path is
                precision=fp16
            augment: detection: test-time augmentation, the image at 1, 0.83 (flipped) and 0.67 of imgsz, the
                boxes merged
            tiling: detection: sliced inference of large images, overlapping tiles of tile pixels each predicted at
                imgsz, the boxes merged
            tile: with tiling: the tiles' side in the image's pixels (default: imgsz)
            overlap_ratio: with tiling: neighbouring tiles overlap by this fraction of a tile
            tile_full: with tiling: also predict the whole image at imgsz and merge its boxes (SAHI's full pass)
            tile_merge: with tiling: boxes of one object merged by ios (intersection over the smaller box, SAHI's)
                or iou, above the iou threshold
            verbose: a progress bar
            profile: synchronize between the stages so that Results.speed is exact
            stream: yield the results one step at a time (constant memory; files decoded lazily)
            vid_stride: predict every N-th frame of a video
            show: show the annotated frames in a window (where a display exists)
            timeout: seconds a camera or stream URL may take to answer
            strict: an unreadable file of a directory or glob stops the call (default: a warning naming it, and the
                rest go on)
            threads: torch's intra-op threads on the CPU (default: from the cores this process can get)
            conf: detection: confidence threshold
            iou: detection: NMS IoU threshold
            max_det: detection: detections kept per image (an ONNX model: its exported max_det)
            max_nms: detection: candidates per image entering NMS (default 1000, or max_det when larger)
            classes: detection: only these classes, ids or names, e.g. 0,2 or person,car
            agnostic_nms: detection: NMS across classes
            topk: classification: classes returned per image
            prompts: classification with a text tower (CLIP, SigLIP 2): zero-shot classes, text prompts
                separated by commas, e.g. 'a cat,a dog'; segment-prompt: 'grid' for automatic mask generation
                (every object; also what a Python call without a prompt does)
            det_thresh: ocr: text-pixel threshold of the detector's map
            box_thresh: ocr: mean score a text box needs
            unclip_ratio: ocr: how far a text box is grown
            rec_conf: ocr: confidence a recognised line needs
            max_lines: ocr: text lines per image at most
            rec_batch: ocr: lines recognised per forward
            points: segment-prompt: points x,y;x,y in pixels, or 'center' (the default without boxes)
            labels: segment-prompt: one label per point, 1 foreground / 0 background, e.g. 1,0
            boxes: segment-prompt: boxes x1,y1,x2,y2;... in pixels
            multimask: segment-prompt: three candidate masks, as SAM gives, or one
            mask_input: segment-prompt (SAM, SAM 2, EdgeTAM): a mask prompt - low-resolution logits
                (``Results.masks.logits[i]`` of a previous call) or a bool mask of the image, or a file
            threshold: panoptic: class probability a query needs to make a segment
            mask_threshold: panoptic: mask probability of a segment's pixels
            overlap_threshold: panoptic: share of its own mask a query must win (else it is dropped as occluded)
            tile_overlap: restore: pixels the tiles (imgsz a side) overlap their neighbours by, blended across
                (default: 16, at most a quarter of imgsz)
            tile_batch: restore: tiles per forward (the last batch filled up: one shape)
            nms_radius: point: a peak of the centroid map must be its class's largest within this many cells (0:
                every cell above conf)
            points_per_side: segment-prompt, prompts=grid: grid points per side
            points_per_batch: segment-prompt, prompts=grid: grid points decoded together
            pred_iou_thresh: segment-prompt, prompts=grid: predicted IoU a mask needs
            stability_score_thresh: segment-prompt, prompts=grid: stability score a mask needs
            box_nms_thresh: segment-prompt, prompts=grid: NMS IoU threshold between masks' boxes
            on_results: called as on_results(result, item) for each Results before it is saved, shown or
                returned

        Returns:
            One image (a file, a PIL image, an (H, W, 3) array or (3, H, W) tensor): its one Results.
            A list, directory, glob, video or 4-D batch: a list of them, one per image or frame
            (:func:`~libreyolo.data.sources.one_or_all`); a generator with stream=True.
        """
        from ..data.sources import one_or_all
        return one_or_all(source, self.get_predictor()(source, **kwargs))

    __call__ = predict

    def track(self, source: Any, *, tracker: Any = "bytetrack", persist: bool = False, **kwargs) -> list:
        """Predict with multi-object tracking (``Results.boxes.id``); see
        :meth:`libreyolo.engine.predictor.Predictor.track` for the options.

        Args:
            source: what :meth:`predict` takes (a video, a camera, a stream, a frame at a time with persist=True)
            conf: confidence threshold (detections below the tracker's 0.25 only extend tracks)
            tracker: bytetrack, botsort, ocsort or deepocsort (or, from Python, a tracker object)
            persist: keep the trackers (and their ids) from the previous track call
            frame: segment-prompt video (SAM 2, EdgeTAM, whose ``track`` follows prompted objects):
                the frame the prompt is on
            obj_id: segment-prompt video: the id of the prompted object
            **kwargs: every other option of :meth:`predict`

        Returns:
            One Results per frame, with ``boxes.id``: a list, or a generator with stream=True.
            Detection, instance segmentation and pose models: masks and keypoints follow their
            boxes' tracks (the same rows, in the same order).
        """
        from ..engine.track import check_trackable
        check_trackable(self)
        return self.get_predictor().track(source, tracker=tracker, persist=persist, **kwargs)
    # ------------------------------------------------------------------ export
    def export(self, format: str = "onnx", **kwargs) -> Path:
        """Write the model for another runtime; returns the file written.

        ``format="onnx"``: the network and the task's post-processing as one ONNX graph with this
        model's metadata (options: ``file``, ``imgsz``, ``batch``, ``dynamic``, ``half``,
        ``simplify``, ``opset``, detection / segment / obb ``max_det``/``max_nms``/``agnostic_nms``,
        classification ``topk``; see :func:`libreyolo.export.onnx.export_onnx` and docs/export.md).
        ``LibreYOLO(path)`` loads the file back, run by onnxruntime.

        Args:
            format: export format
            file: where to write (default: beside the checkpoint, same name, .onnx)
            imgsz: input size (default: the model's)
            batch: batch size of a static graph
            dynamic: symbolic batch, height and width
            half: float16 weights (onnxruntime's CPU fp16 kernels are limited)
            simplify: run onnxscript's optimizer over the graph
            opset: ONNX opset (default 17)
            max_det: detection, segment, obb: instances per image (rows of the output)
            max_nms: detection, segment: candidates per image entering NMS (default 1000, or max_det when larger)
            agnostic_nms: detection, segment, obb: NMS across classes
            topk: classification: classes the graph returns
            int8: openvino, engine: int8 post-training quantization calibrated on data=
            data: int8's calibration set: a built-in set's name or a dataset YAML (its training images)

        Returns:
            Path: the file written.
        """
        from ..export import export_model
        return export_model(self, format, **kwargs)


def load_strict(net: nn.Module, sd: dict, what: str, source: str | None) -> None:
    ref = net.state_dict()
    missing = [k for k in ref if k not in sd]
    unexpected = [k for k in sd if k not in ref]
    bad = [f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(ref[k].shape)}"
           for k in ref if k in sd and tuple(sd[k].shape) != tuple(ref[k].shape)]
    # load_state_dict casts silently: integer or boolean values into a floating-point weight, or a
    # complex tensor's real part, would load as other numbers (a float16 file into float32 is fine)
    wrong_type = [f"{k}: checkpoint {sd[k].dtype} vs model {ref[k].dtype}" for k in ref
                  if k in sd and isinstance(sd[k], torch.Tensor)
                  and ((ref[k].is_floating_point() and not sd[k].is_floating_point())
                       or (sd[k].is_complex() and not ref[k].is_complex()))]
    if missing or unexpected or bad or wrong_type:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        if bad:
            parts.append(f"{len(bad)} with the wrong shape (e.g. {'; '.join(bad[:3])})")
        if wrong_type:
            parts.append(f"{len(wrong_type)} of the wrong kind of number (e.g. {'; '.join(wrong_type[:3])})")
        raise ValueError(f"{source or 'state dict'} does not match {what}: " + ", ".join(parts))
    net.load_state_dict(sd, strict=True)



