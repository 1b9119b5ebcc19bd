"""Device selection shared by models, the trainer and the CLI; the host's usable cores; whether the
installed torch and torchvision work together."""
from __future__ import annotations

import os
from typing import Any

import torch


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "process_cpu_count"):  # Python >= 3.13
        return max(1, os.process_cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


_PAIR: dict[str, str | None] = {}


def _dist_version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "unknown"


def torch_pair_problem() -> str | None:
    """None where torchvision imports and its operators are registered for this torch (what NMS
    needs), else one message naming both versions and how to reinstall them together. Checked
    once per process (importing torchvision takes seconds the first time)."""
    if "problem" not in _PAIR:
        try:
            import torchvision.ops  # noqa: F401
            torch.ops.torchvision.nms   # noqa: B018  (raises where the compiled operators did not load)
            _PAIR["problem"] = None
        except Exception as exc:   # noqa: BLE001  (ImportError; RuntimeError "operator ... does not exist")
            tv = _dist_version("torchvision")
            base = torch.__version__.split("+")[0]
            major, minor = (base.split(".") + ["0"])[:2]
            pair = (f"torch=={base} torchvision==0.{int(minor) + 15}.*" if major == "2" and minor.isdigit()
                    else f"torch=={base} torchvision")
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            _PAIR["problem"] = (
                f"torch {torch.__version__} and torchvision {tv} do not work together ({first}): reinstall "
                f"them together from one index, e.g. pip install --force-reinstall \"{pair}\" (add "
                "--index-url https://download.pytorch.org/whl/cpu, or your CUDA version's, as the first install "
                "did)")
    return _PAIR["problem"]


def require_torch_pair() -> None:
    """Raise one RuntimeError (see :func:`torch_pair_problem`) where torch and torchvision do not
    work together: at a run's start, not minutes later at the first NMS."""
    problem = torch_pair_problem()
    if problem is not None:
        raise RuntimeError(problem)


def select_device(device: Any = "auto") -> torch.device:
    """'auto' -> cuda if available else cpu; also accepts 'cpu', 'cuda', 'cuda:1', 0, '0'."""
    if device is None or (isinstance(device, str) and device.lower() == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, torch.device):
        dev = device
    else:
        if isinstance(device, int) or (isinstance(device, str) and device.isdigit()):
            device = f"cuda:{int(device)}"
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a GPU index, got {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device '{device}' was asked for, but this machine has no CUDA GPU "
                           "(torch.cuda.is_available() is False); use device='cpu' or 'auto'")
    return dev
