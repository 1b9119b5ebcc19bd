"""Device selection shared by models, the trainer and the CLI; the host's usable cores."""
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
