"""The kernels of one training epoch as the trainer runs it (issue 16: what a step does beyond
``benchmarks/train_step.py``'s bare step - accumulation, EMA, the batch's upload, the loss on
augmented targets).

    PYTHONPATH=. python3 scripts/profile_train_epoch.py [--epoch 6] [--json FILE] -- \
        model=yolo9t data=shapes epochs=8 batch=16 imgsz=320 cuda_graph=true

Runs ``model.train`` with the options after ``--`` and records, with torch.profiler (CUDA
activity only), from the end of epoch ``--epoch - 1``'s hooks to the start of epoch ``--epoch``'s
hooks: that epoch's steps and nothing of validation. Prints the kernels per step by group, the
top kernels (ms and launches per step), and how much of the epoch's wall the device was busy
(the union of the kernels' and copies' intervals). The epoch before it runs under cProfile (the
host's side: ``--cprofile-top`` functions by cumulative and by own time).
"""
import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from train_step import KERNEL_GROUPS  # noqa: E402

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.engine import hooks as H  # noqa: E402
from libreyolo.engine import trainer as T  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epoch", type=int, default=6, help="the epoch (0-based) profiled")
    ap.add_argument("--json", default=None)
    ap.add_argument("--cprofile-top", type=int, default=45)
    ap.add_argument("options", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    opts = dict(o.split("=", 1) for o in (a.options[1:] if a.options[:1] == ["--"] else a.options))
    model = LibreYOLO(opts.pop("model", "yolo9t"))
    prof = profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU])
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    host = cProfile.Profile()
    seen = {}

    class Start(H.HookBase):   # after the built-in hooks: after the previous epoch's validation and writes
        def after_epoch(self):
            state = self.trainer.epoch_state
            if state["epoch"] == a.epoch - 2:
                sync()
                host.enable()
            if state["epoch"] == a.epoch - 1:
                sync()
                prof.start()

    class Stop(H.HookBase):    # first of the hooks: before this epoch's validation
        def after_epoch(self):
            t, state = self.trainer, self.trainer.epoch_state
            if state["epoch"] == a.epoch - 1:
                sync()
                host.disable()
                seen["host_epoch_s"] = state["time_s"]
            if state["epoch"] == a.epoch:
                sync()
                prof.stop()
                seen["steps"] = len(t.train_loader)
                seen["time_s"] = state["time_s"]

    init = T.Trainer.__init__

    def patched(self, *args, **kw):
        init(self, *args, **kw)
        first = Stop()
        first.trainer = self
        self.hooks.insert(0, first)
        self.register_hooks([Start()])
    T.Trainer.__init__ = patched
    model.train(**opts)
    steps = seen["steps"]
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]

    def us(e) -> float:
        return getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)

    groups: dict[str, list[float]] = {}
    for e in kernels:
        g = next((g for frag, g in KERNEL_GROUPS if frag.lower() in e.key.lower()), "other")
        acc = groups.setdefault(g, [0.0, 0.0])
        acc[0] += us(e) / 1e3 / steps
        acc[1] += e.count / steps
    kernels.sort(key=us, reverse=True)
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == DeviceType.CUDA)
    busy, end = 0.0, None
    for s0, s1 in spans:   # the union of the device's intervals (us)
        if end is None or s0 > end:
            busy += s1 - s0
            end = s1
        elif s1 > end:
            busy += s1 - end
            end = s1
    window = (spans[-1][1] - spans[0][0]) if spans else 0.0
    text = io.StringIO()
    st = pstats.Stats(host, stream=text)
    st.sort_stats("cumulative").print_stats(a.cprofile_top)
    st.sort_stats("tottime").print_stats(a.cprofile_top)
    res = {"options": opts, "epoch": a.epoch, "steps": steps, "epoch_s": seen["time_s"],
           "host_profiled_epoch_s": seen.get("host_epoch_s"),
           "device_busy_ms": busy / 1e3, "device_window_ms": window / 1e3,
           "kernel_ms_per_step": sum(us(e) for e in kernels) / 1e3 / steps,
           "kernels_per_step": sum(e.count for e in kernels) / steps,
           "groups": {g: {"ms": round(v[0], 3), "kernels": round(v[1], 1)}
                      for g, v in sorted(groups.items(), key=lambda kv: -kv[1][0])},
           "top": [{"kernel": e.key[:140], "ms": round(us(e) / 1e3 / steps, 3), "per_step": e.count / steps}
                   for e in kernels[:45]],
           "torch": torch.__version__}
    print(json.dumps(res, indent=1))
    print(text.getvalue())
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
