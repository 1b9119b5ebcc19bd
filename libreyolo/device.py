"""Device selection shared by models, the trainer and the CLI."""
from __future__ import annotations

from typing import Any

import torch


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
