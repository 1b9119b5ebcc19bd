"""torch's intra-op thread count on the CPU, chosen from the cores this process can actually get.

torch starts with one thread per physical core. On a machine whose cores other processes keep
busy, those threads wait on each other at every operator (each waits for the slowest, which the
scheduler has parked): a CPU epoch then takes several times as long as with fewer threads. So on
the CPU, train, predict and val set the count once per process (:func:`apply_threads`) to the
smallest of

* torch's own count (this module never raises it),
* the cores of the process's affinity mask (``os.sched_getaffinity``: taskset, a container's cpuset),
* the cgroup's CPU quota (``cpu.max``, cgroup v2; ``cpu.cfs_quota_us`` v1), rounded down, at least 1,
* the cores left idle by the machine's one-minute load average (``os.getloadavg``), rounded, at least 1,

and say so in one log line naming the figures. ``threads=N`` (the option of train, predict and
val) or the environment variable ``LIBREYOLO_THREADS`` choose the count instead. A count the user
chose for torch is left alone: ``OMP_NUM_THREADS`` set, or ``torch.set_num_threads`` called
(torch's count no longer the one it had when this module was imported - with the first model -,
nor the one it last set). A count set before that is taken for torch's own, and only ever lowered.
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import torch

from .device import available_cores

__all__ = ["ENV", "apply_threads", "cgroup_cpus", "choose_threads"]

log = logging.getLogger(__name__)

#: the environment variable that sets the count (as ``threads=`` does)
ENV = "LIBREYOLO_THREADS"

#: torch's count when the package was imported: its own default, or the user's
_INITIAL = torch.get_num_threads()
#: what :func:`apply_threads` last set (None: nothing yet) and the automatic choice, made once
_state: dict[str, Any] = {"set": None, "auto": None, "logged": None}

_CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpus(root: Path = _CGROUP) -> float | None:
    """The CPUs the cgroup's quota allows (quota / period), None without a quota."""
    try:
        text = (root / "cpu.max").read_text().split()   # cgroup v2: "max 100000" or "200000 100000"
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:   # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):   # a platform without it
        return None


def _requested(value: Any) -> tuple[int | None, str]:
    """The count the caller asked for: ``value`` (the option), else ``LIBREYOLO_THREADS``."""
    from .options import OptionError, check_int
    if value is not None and not (isinstance(value, str) and value.strip().lower() in ("auto", "none", "")):
        return check_int("threads", value, 1), f"threads={value} given"
    env = os.environ.get(ENV, "").strip()
    if env and env.lower() != "auto":
        try:
            return check_int(ENV, env, 1), f"{ENV}={env}"
        except OptionError as exc:
            raise OptionError(f"{exc} (the environment variable)") from None
    return None, ""


def choose_threads(value: Any = None, *, cores: int | None = None, quota: float | None = None,
                   load: float | None = None, machine_cores: int | None = None,
                   current: int | None = None) -> tuple[int | None, str]:
    """``(count, why)``: the intra-op thread count to use on the CPU and the reason, in words;
    count None: leave torch's count as it is (the user chose it). ``value``: the ``threads``
    option (None or "auto": automatic). The keyword arguments replace what is read from the
    machine (tests): the affinity's cores, the cgroup's quota, the one-minute load, the machine's
    cores, torch's current count."""
    n, why = _requested(value)
    if n is not None:
        return n, why
    if os.environ.get("OMP_NUM_THREADS"):
        return None, f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} is set"
    current = torch.get_num_threads() if current is None else current
    if current not in (_INITIAL, _state["set"]):
        return None, f"torch.set_num_threads({current}) was called"
    cores = available_cores() if cores is None else cores
    quota = cgroup_cpus() if quota is None else quota
    load = _load() if load is None else load
    machine_cores = (os.cpu_count() or cores) if machine_cores is None else machine_cores
    n = min(_INITIAL, cores)
    parts = [f"torch's default {_INITIAL}", f"{cores} core(s) available"]
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
        parts.append(f"cgroup quota {quota:g} CPU(s)")
    if load is not None:
        idle = max(1, round(machine_cores - load))
        n = min(n, idle)
        parts.append(f"load {load:.1f} on {machine_cores} core(s)")
    return max(1, n), "from " + ", ".join(parts) + f" (set {ENV} or threads= to choose)"


def apply_threads(value: Any = None, device: Any = "cpu") -> int:
    """Set torch's intra-op thread count for work on ``device`` (only the CPU's), as
    :func:`choose_threads` decides; the automatic choice is made once per process (the load then
    includes this process's own work). Logs one line whenever the count it sets changes (or why
    it sets none). Returns torch's count afterwards."""
    if torch.device(device).type != "cpu":
        return torch.get_num_threads()
    if value is None and not os.environ.get(ENV) and _state["auto"] is not None:
        n, why = _state["auto"]
        if torch.get_num_threads() not in (_INITIAL, _state["set"]):   # the user set it since
            n, why = None, f"torch.set_num_threads({torch.get_num_threads()}) was called"
    else:
        n, why = choose_threads(value)
        if value is None and not os.environ.get(ENV):
            _state["auto"] = (n, why)
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)
    if n is not None:
        _state["set"] = n
    line = (f"CPU threads: {n}, {why}" if n is not None else
            f"CPU threads: left at {torch.get_num_threads()}, {why}")
    if line != _state["logged"]:
        log.info("%s", line)
        _state["logged"] = line
    return torch.get_num_threads()
