"""Starting a multi-GPU training run: the torchrun command lines, and the per-rank entry point
that rebuilds the model in each process.

``libreyolo train device=0,1`` re-runs the same command line under ``python -m
torch.distributed.run --standalone --nproc-per-node N`` (:func:`cli_train_command`);
``model.train(device=[0, 1])`` saves the model to a temporary checkpoint and starts ``python -m
libreyolo.launch SPEC.json`` under torchrun (:func:`train_from_python`), each rank of which
(:func:`rank_main`) loads the checkpoint and calls ``train`` with the same options. What a rank
does once it runs - the process group, the gradient all-reduce, the loss reduction rule - is
:mod:`libreyolo.distributed`, which the training loop and the losses import; this module
rebuilds models (it imports the family registry), so it stays out of their imports.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from .distributed import DistributedError, env_rank, local_device, parse_devices
from .weights import load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)


def check_gpus(gpus: Sequence[int]) -> None:
    """Refuse a GPU list naming GPUs this machine does not have, before any process starts."""
    from .options import OptionError
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = [g for g in gpus if g >= count]
    if missing:
        why = "" if count else " (torch.cuda.is_available() is False)"
        raise OptionError(f"device={','.join(map(str, gpus))} asks for GPU(s) {', '.join(map(str, missing))}, but this "
                          f"machine has {count} CUDA GPU(s){why}")


def torchrun_command(nproc: int, target: Sequence[str], *, python: str | None = None) -> list[str]:
    """The command line that starts ``nproc`` copies of ``target`` (``["-m", "libreyolo.cli",
    "train", ...]``) on this machine under torchrun (``--standalone``: a rendezvous on a free
    local port, no other configuration)."""
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(int(nproc)), *target]


def cli_train_command(argv: Sequence[str], nproc: int, *, python: str | None = None) -> list[str]:
    """``libreyolo train <argv>`` as a torchrun command of ``nproc`` ranks (the same arguments)."""
    return torchrun_command(nproc, ["-m", "libreyolo.cli", "train", *argv], python=python)


def launch_env(base: dict | None = None) -> dict:
    """The environment of the launched ranks: NCCL's asynchronous error handling on (a rank whose
    peer died fails its collective instead of waiting forever), one CPU thread per rank unless
    set (torchrun's own default, said explicitly so it does not warn)."""
    env = dict(os.environ if base is None else base)
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launch(cmd: Sequence[str], env: dict | None = None) -> int:
    """Run a torchrun command to its end; returns its exit status (torchrun's: non-zero when any
    rank failed, after it stopped the others)."""
    log.info("distributed run: %s", " ".join(cmd))
    return subprocess.run(list(cmd), env=launch_env(env)).returncode


def train_from_python(model, kwargs: dict, nproc: int) -> dict:
    """``model.train(device=[0, 1], ...)``: the model's current weights go to a temporary
    checkpoint, each rank of a torchrun run loads it and calls ``train`` with the same options
    (``python -m libreyolo.launch <spec.json>``); rank 0's result comes back, and ``model``
    takes the trained weights (those of ``best.pt``, else ``last.pt``, as after a one-process run)."""
    try:
        json.dumps(kwargs)
    except TypeError as exc:
        raise DistributedError(f"multi-GPU training passes the training options to torchrun's processes as JSON; "
                               f"one of them is not JSON-serializable: {exc}") from None
    gpus = parse_devices(kwargs.get("device")) or []
    check_gpus(gpus)
    with tempfile.TemporaryDirectory(prefix="libreyolo-ddp-") as tmp:
        ckpt, spec, result = Path(tmp) / "model.pt", Path(tmp) / "spec.json", Path(tmp) / "result.json"
        save_checkpoint(model.checkpoint(), ckpt)
        spec.write_text(json.dumps({"checkpoint": str(ckpt), "family": model.FAMILY, "trained": bool(model.trained),
                                    "kwargs": kwargs, "result": str(result)}))
        rc = launch(torchrun_command(nproc, ["-m", "libreyolo.launch", str(spec)]))
        if rc != 0 or not result.is_file():
            raise DistributedError(f"the distributed training run failed (torchrun exit status {rc}); the ranks' "
                                   "errors are above. A run that saved an epoch can go on with resume=True")
        res = json.loads(result.read_text())
    path = res["best"] if Path(res["best"]).is_file() else res["last"]
    last = load_checkpoint(path)
    if int(last.get("nc") or model.nc) != model.nc:   # the ranks rebuilt the head for the data's classes
        model.reset_classes(int(last["nc"]), last.get("names"))
    model.load_state_dict(last["model"])
    model.names = {int(k): v for k, v in (last.get("names") or model.names).items()}
    model.imgsz = int(last.get("imgsz") or model.imgsz)
    model.ckpt_path = str(path)
    return res


def rank_main(spec_path: str) -> int:
    """One rank of :func:`train_from_python`'s run."""
    from .models.registry import get_family
    spec = json.loads(Path(spec_path).read_text())
    kwargs = dict(spec["kwargs"])
    device = local_device(kwargs.get("device"))
    model = get_family(spec["family"]).from_checkpoint(load_checkpoint(spec["checkpoint"]), device=device,
                                                       source=spec["checkpoint"])
    model.trained = bool(spec["trained"])
    res = model.train(**kwargs)
    if env_rank() == 0:
        tmp = Path(spec["result"]).with_suffix(".tmp")
        tmp.write_text(json.dumps(res, default=str))   # numpy scalars and the like as text
        os.replace(tmp, spec["result"])
    return 0


if __name__ == "__main__":   # one rank of model.train(device=[...]) (see train_from_python)
    if len(sys.argv) != 2:
        sys.exit("usage: python -m libreyolo.launch SPEC.json (started by torchrun; see train_from_python)")
    sys.exit(rank_main(sys.argv[1]))
