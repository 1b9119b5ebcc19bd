"""Multi-GPU (and multi-process CPU) training through ``torch.distributed``, launched by torchrun.

How a run is distributed:

- **Launch.** ``libreyolo train device=0,1`` (or ``model.train(device=[0, 1])``) re-launches the
  same training under ``python -m torch.distributed.run --standalone --nproc-per-node N`` (see
  :mod:`libreyolo.launch`, which builds those commands and the per-rank entry point); nothing
  here starts or watches processes itself. Multi-node runs use
  torchrun directly (``torchrun --nnodes ... -m libreyolo.cli train ...``). A process started by
  torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` in its environment) trains as one rank:
  :meth:`Distributed.setup` joins the process group (NCCL on CUDA, gloo on the CPU) and picks the
  device from ``LOCAL_RANK``.
- **Batch.** ``batch`` is the global batch, split evenly across the ranks (it must divide by the
  world size); learning rate, nominal batch (``nbs``, gradient accumulation) and weight decay
  follow the global batch, so N ranks at ``batch=B`` take the steps one GPU takes at ``batch=B``.
- **Gradients.** Not torch's DDP wrapper: after backward, on the update step, one ``all_reduce``
  of a flat buffer that the parameters' ``.grad`` tensors are views of (:class:`GradientReducer`),
  before unscaling, clipping and the optimizer. The same kernels run eager and inside a captured
  whole training step, so capture keeps eager == graph under distribution too.
- **Loss reduction rule.** A loss declares ``DDP_REDUCTION``: ``"sum"`` - the loss computes its
  rank's *share* of the global-batch loss (every normalizer it divides by - positive count, score
  sum, batch size - summed over the ranks through :func:`global_sum` / :func:`global_batch`
  while :func:`loss_share` is on), so summing the ranks' gradients gives the one-process
  gradient of the global batch up to float rounding (YOLOv9, YOLOv7, YOLOX, RTMDet, PicoDet);
  ``"mean"`` (the default) - the loss normalizes by its local batch, the gradients are averaged:
  exact for per-sample means over equal local batches (classification, segmentation
  cross-entropy), approximate where a normalizer depends on the batch's content (the DETR line's
  box count).
  Logged loss items are reduced the same way inside the step.
- **Rank 0 writes.** Only rank 0 validates, logs, plots and writes ``results.csv``, TensorBoard
  events and checkpoints; the others wait for it at the end of each epoch (the broadcast of its
  decision to stop or go on is that barrier).
- **Capture.** All ranks decide together: a capture that failed on any rank is dropped on every
  rank (:meth:`Distributed.agree`), so no rank replays a collective its peers do not run. The
  ranks run the same shapes: a task whose target rows vary (detection) has every step's
  targets padded to the largest row count of the ranks (:meth:`Distributed.max_int`, on a CPU
  group), so a new shape is met - and captured, warm-up collectives included - on every rank at
  the same step.
- **Faults.** The process group has a timeout (:data:`DEFAULT_TIMEOUT_S`, ``ddp_timeout=``);
  NCCL's asynchronous error handling is on, so a rank blocked in a collective with a dead peer
  fails instead of hanging; torchrun stops the other ranks when one exits with an error.
  ``last.pt`` is written atomically by rank 0 and stays loadable.
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .logs import package_logger
from .weights import is_dense

log = logging.getLogger(__name__)

#: seconds a collective (a barrier while rank 0 validates, say) may wait before the run fails;
#: long enough for a large validation set on rank 0, short enough that a dead rank is noticed
DEFAULT_TIMEOUT_S = 1800

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class DistributedError(RuntimeError):
    """A distributed run could not start or could not go on (a rank stopped, a bad setting)."""


# ----------------------------------------------------------------------------- this rank


def launched() -> bool:
    """Whether this process was started by torchrun (or anything that sets its variables)."""
    return all(k in os.environ for k in _ENV)


def env_rank() -> int:
    return int(os.environ.get("RANK", 0))


def env_world() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def env_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def parse_devices(device: Any) -> list[int] | None:
    """The GPU indices of a multi-GPU ``device`` (``"0,1"``, ``[0, 1]``, ``"cuda:0,cuda:1"``), or
    None when ``device`` names one device (``"auto"``, ``"cpu"``, ``0``, ``"cuda:1"``).

    Raises :class:`~libreyolo.options.OptionError` for a list with a bad or repeated entry."""
    from .options import OptionError
    if isinstance(device, str):
        if "," not in device:
            return None
        items: list[Any] = device.split(",")
    elif isinstance(device, (list, tuple)):
        items = list(device)
        if len(items) == 1:
            return None
    else:
        return None
    out = []
    for item in items:
        text = str(item).strip().lower()
        if text.startswith("cuda:"):
            text = text[5:]
        if isinstance(item, bool) or not text.isdigit():
            raise OptionError(f"device: {item!r} is not a GPU index in device={device!r} (multi-GPU training takes "
                              "GPU indices, e.g. device=0,1)")
        if int(text) in out:
            raise OptionError(f"device={device!r} names GPU {int(text)} twice")
        out.append(int(text))
    return out


def local_device(device: Any) -> str:
    """This rank's device in a launched run: ``cuda:<i>`` - the ``LOCAL_RANK``-th of the GPUs that
    ``device`` lists, else GPU ``LOCAL_RANK`` - or ``cpu`` when ``device`` says cpu (gloo runs)."""
    if isinstance(device, str) and device.strip().lower() == "cpu":
        return "cpu"
    local = env_local_rank()
    gpus = parse_devices(device)
    if gpus is None and device not in (None, "auto", "cuda") and int(os.environ.get("LOCAL_WORLD_SIZE", 1)) == 1:
        from .device import select_device
        dev = select_device(device)   # one rank on this node: the device it names
        if dev.type == "cuda":
            return str(dev)
    if gpus is not None:
        if local >= len(gpus):
            raise DistributedError(f"LOCAL_RANK={local} but device={device!r} lists {len(gpus)} GPUs: start as many "
                                   "processes per node as GPUs listed (--nproc-per-node)")
        return f"cuda:{gpus[local]}"
    if device in (None, "auto") and not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{local}"


# ------------------------------------------------------------------------------- loss reduction

_SHARE = {"on": False, "world": 1}


@contextlib.contextmanager
def loss_share(on: bool = True) -> Iterator[None]:
    """While on (the trainer's training step of a distributed run), :func:`global_sum` sums over
    the ranks and :func:`global_batch` is the global batch: a loss then computes its rank's share
    of the global-batch loss. Off (validation, one-process runs) both are the identity."""
    previous = dict(_SHARE)
    _SHARE.update(on=bool(on and dist.is_available() and dist.is_initialized()),
                  world=dist.get_world_size() if on and dist.is_available() and dist.is_initialized() else 1)
    try:
        yield
    finally:
        _SHARE.update(previous)


def global_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the ranks inside :func:`loss_share`, else ``t`` itself. For a loss's
    normalizers (positive counts, score sums): they carry no gradient."""
    if not _SHARE["on"]:
        return t
    out = t.detach().clone()
    dist.all_reduce(out)
    return out


def global_batch(b: int) -> int:
    """The global batch of a local batch ``b`` inside :func:`loss_share` (the ranks' batches are
    equal: the sampler gives every rank as many images), else ``b``."""
    return b * _SHARE["world"]


def share_of_mean(mean: torch.Tensor, b: int) -> torch.Tensor:
    """A per-sample mean over the local batch ``b`` as its share of the global-batch mean
    (``mean * b / B``) inside :func:`loss_share`; else ``mean`` itself (bitwise)."""
    if not _SHARE["on"]:
        return mean
    return mean * (b / global_batch(b))


def reduction_of(loss_fn: Any) -> str:
    """A loss module's rule (see the module docstring): ``"sum"`` or ``"mean"``."""
    rule = getattr(loss_fn, "DDP_REDUCTION", "mean")
    if rule not in ("sum", "mean"):
        raise ValueError(f"{type(loss_fn).__name__}.DDP_REDUCTION must be 'sum' or 'mean', got {rule!r}")
    return rule


# ------------------------------------------------------------------------------------ gradients


class GradientReducer:
    """The gradients of ``params`` as views of one flat buffer, reduced across the ranks by one
    ``all_reduce`` (:meth:`__call__`).

    Each ``.grad`` is a view with its parameter's own strides (channels_last weights keep
    channels_last gradients) into a slice of the buffer, so autograd accumulates straight into
    it and no copy is needed before or after the collective. The trainer clears gradients in
    place (``zero_grad(set_to_none=False)``), which keeps the views. ``mean=True`` divides by the
    world size after the sum (the ``"mean"`` rule)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], world: int, mean: bool):
        self.params = [p for p in params if p.requires_grad]
        self.world, self.mean = int(world), bool(mean)
        if not self.params:
            self.flat = None
            return
        dtype, device = self.params[0].dtype, self.params[0].device
        if any(p.dtype != dtype or p.device != device for p in self.params):
            raise DistributedError("the trainable parameters must share one dtype and device for the gradient "
                                   "all-reduce")
        total = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(total, dtype=dtype, device=device)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                if not is_dense(p):
                    raise DistributedError(f"a parameter of shape {tuple(p.shape)} is not dense in memory; the flat "
                                           "gradient buffer needs dense parameters")
                view = self.flat.as_strided(p.shape, p.stride(), offset)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                offset += p.numel()

    def attached(self) -> bool:
        """Whether every parameter's gradient is still its view of the buffer (a ``zero_grad``
        with ``set_to_none=True`` would have dropped them)."""
        return self.flat is not None and all(p.grad is not None and p.grad._base is self.flat for p in self.params)

    def __call__(self) -> None:
        """Sum (or average) the gradients over the ranks, in place."""
        if self.flat is None:
            return
        dist.all_reduce(self.flat)
        if self.mean and self.world > 1:
            self.flat.div_(self.world)


# ------------------------------------------------------------------------------------- the group


class Distributed:
    """This process's place in a distributed run, and the collectives the trainer uses.

    Built by :meth:`setup` (None outside a distributed run): it joins the process group unless
    one is already initialized (a test that spawned its own ranks), sets the CUDA device, and
    leaves the group at :meth:`teardown` if it joined it."""

    def __init__(self, rank: int, world: int, local_rank: int, device: torch.device, owns_group: bool):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.device, self.owns_group = device, owns_group
        self.backend = dist.get_backend()
        self._cpu_group = None   # see max_int

    @classmethod
    def setup(cls, device: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> Distributed | None:
        """Join the run this process belongs to, or return None when it belongs to none."""
        if not (dist.is_available() and (dist.is_initialized() or launched())):
            return None
        owns = False
        if dist.is_initialized():
            dev = _rank_device(device)
        else:
            dev = torch.device(local_device(device))
            backend = "nccl" if dev.type == "cuda" else "gloo"
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
                os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
            try:
                dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout_s)),
                                        device_id=dev if dev.type == "cuda" else None)
            except Exception as exc:
                raise DistributedError(f"rank {env_rank()} of {env_world()} could not join the process group "
                                       f"({backend}): {type(exc).__name__}: {exc}") from exc
            owns = True
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        d = cls(dist.get_rank(), dist.get_world_size(), env_local_rank(), dev, owns)
        if d.rank != 0:   # rank 0 alone reports; the others say only what goes wrong
            package_logger().setLevel(logging.WARNING)
        log.info("distributed training: %d ranks (%s), rank 0 on %s", d.world, d.backend, dev)
        return d

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def local_batch(self, batch: int) -> int:
        """The per-rank batch of the global ``batch``; an error when it does not divide."""
        from .options import OptionError
        if batch % self.world:
            raise OptionError(f"batch={batch} is the global batch of a {self.world}-rank run and must be a multiple "
                              f"of {self.world} (each rank takes batch/{self.world}); e.g. batch="
                              f"{max(self.world, batch - batch % self.world)}")
        return batch // self.world

    def barrier(self) -> None:
        dist.barrier()

    def main_first(self, fn: Callable[[], Any], what: str) -> Any:
        """``fn()`` on rank 0, then - once rank 0's call has returned - on the others: work whose
        first call writes what later calls reuse (a built-in dataset generated into the cache,
        with a worker pool of its own) is done once, not by every rank at the same time. When
        rank 0's call raises, the others raise a :class:`DistributedError` naming it (``what``:
        what ``fn`` does, for the message) instead of waiting in a later collective."""
        if self.is_main:
            try:
                out = fn()
            except Exception as exc:
                self.broadcast_object(f"{type(exc).__name__}: {exc}")
                raise
            self.broadcast_object(None)
            return out
        failed = self.broadcast_object(None)
        if failed is not None:
            raise DistributedError(f"rank 0 could not {what}: {failed}")
        return fn()

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (small Python objects: a path, a decision)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device if self.backend == "nccl" else None)
        return box[0]

    @torch.no_grad()
    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers into every rank's ``module`` (one collective per
        tensor, once at the start)."""
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_contiguous():
                dist.broadcast(t.data, src=0)
            else:   # channels_last weights: through a contiguous copy (not every backend takes strides)
                tmp = t.detach().contiguous()
                dist.broadcast(tmp, src=0)
                t.data.copy_(tmp)

    def max_int(self, value: int) -> int:
        """The largest ``value`` of the ranks, through a CPU (gloo) group: no device sync, so the
        training loop still runs ahead of the device (the group is made at the first call,
        which every rank makes at the same step)."""
        if self._cpu_group is None:
            self._cpu_group = dist.group.WORLD if self.backend == "gloo" else dist.new_group(backend="gloo")
        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._cpu_group)
        return int(t.item())

    def agree(self, ok: bool) -> bool:
        """True on every rank when ``ok`` is True on every rank (a MIN all-reduce)."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def reduce_items(self, items: torch.Tensor, rule: str) -> torch.Tensor:
        """Logged loss items over the ranks: summed (``"sum"`` rule: shares) or averaged."""
        out = items.detach().clone()
        dist.all_reduce(out)
        return out if rule == "sum" else out / self.world

    def teardown(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    def failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a collective that failed (a peer gone, a timeout)."""
        if isinstance(exc, dist.DistError):
            return True
        text = str(exc)
        return isinstance(exc, RuntimeError) and any(s in text for s in (
            "Connection closed by peer", "Connection reset by peer", "NCCL", "gloo", "Timed out", "timed out",
            "ProcessGroup"))


def _rank_device(device: Any) -> torch.device:
    """The device of a rank whose process group was made by the caller: ``device`` if it names
    one, else ``cuda:LOCAL_RANK`` / cpu by the group's backend."""
    if dist.get_backend() == "nccl":
        return torch.device(local_device(device))
    return torch.device("cpu")


def convert_sync_batchnorm(net: torch.nn.Module) -> torch.nn.Module:
    """``sync_bn=True``: the network's BatchNorm layers as SyncBatchNorm (statistics over the
    global batch), sharing the same parameter and buffer tensors."""
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)


def revert_sync_batchnorm(module: torch.nn.Module) -> torch.nn.Module:
    """The inverse of :func:`convert_sync_batchnorm` (after the run: predict, fuse and export
    expect BatchNorm2d), sharing the tensors again."""
    out = module
    if isinstance(module, torch.nn.SyncBatchNorm):
        out = torch.nn.BatchNorm2d(module.num_features, module.eps, module.momentum, module.affine,
                                   module.track_running_stats, device=module.running_mean.device
                                   if module.running_mean is not None else None)
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, revert_sync_batchnorm(child))
    return out
