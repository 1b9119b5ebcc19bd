"""The host path of a classifier's (or a detector's) graphed predict at batch 1, measured on the CPU.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 scripts/host_path_cpu.py [--model resnet 18] [--imgsz 224]
        [--runs 2000] [--profile 200] [--json out.json]

What it times is ``model(img, imgsz=imgsz, cuda_graph=True)`` - ``img`` a uint8 HxWx3 array -
with everything the predictor does on the host, and NO network: the CPU has no CUDA graph, so the
model's runner gets a stand-in capturer (this script only, nowhere in the library) whose
"capture" runs the real stage once and keeps its outputs, and whose "replay" is
:meth:`libreyolo.graphs.capture.CapturedGraph.replay` itself - the copy of each input into the
static buffers - around a launch that does nothing. A GPU replay's launch (a few us) and the
device's work are therefore not in these numbers; everything the library's Python does per call
is. (The stand-in's static outputs are the real stage's on the first image: every call's Results
are checked equal to an eager call's, so the stub changes timing only.)

Two arms in one process, interleaved in blocks: ``reuse`` (the predictor's repeat of the previous
call's signature, :attr:`Predictor.reuse`) and ``full`` (the same predictor with it off: every call
parses its options, builds its plan and keys again). Medians of ``--runs`` calls each, in
microseconds, whole and split at the (stand-in) launch: the host work before it delays the
device; after it, only what follows the outputs' wait (the Results) adds to a GPU call's end to end.
Then one call's host steps: perf_counter stamps around the steps of each arm (median us per
step over ``--profile`` calls) and cProfile's top functions for each arm.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import numpy as np
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.graphs.capture import CapturedGraph


class _NoLaunch:
    """A captured graph's launch that does nothing (the device's work is not measured here); it
    notes when it was called, so a call's host time splits into before and after the launch."""

    launched_at = 0.0

    @classmethod
    def replay(cls) -> None:
        cls.launched_at = time.perf_counter()


class StubCapturer:
    """The stand-in capturer: ``capture`` runs ``fn`` once on static copies of the inputs and
    keeps the outputs; the returned :class:`CapturedGraph` replays with the library's own
    input copies and a launch that does nothing."""

    captures = 0

    @staticmethod
    def can_capture(device) -> bool:
        return True

    def capture(self, fn, inputs, module=None) -> CapturedGraph:
        static = tuple(x.detach().clone() for x in inputs)
        versions = [x._version for x in static]
        with torch.no_grad():
            out = fn(*static)
        self.captures += 1
        return CapturedGraph(_NoLaunch(), static, out, 0.0,
                             writes_inputs=[x._version for x in static] != versions)


def set_reuse(m, on: bool) -> None:
    """The A/B switch: the predictor's per-signature fast dispatch on or off (a class attribute
    of the engine's Predictor, read at each call; off: the full path)."""
    from libreyolo.engine.predictor import Predictor
    if hasattr(Predictor, "reuse"):
        m.get_predictor().reuse = on
    elif on:
        raise SystemExit("this tree's Predictor has no per-signature reuse (Predictor.reuse): run the full arm only")


def timed(fn, n: int, split: list | None = None) -> list[float]:
    """Host us of ``n`` calls of ``fn``; with ``split``, each call's (us before the launch, us
    after it) appended there."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        out.append((t1 - t0) * 1e6)
        if split is not None:
            split.append(((_NoLaunch.launched_at - t0) * 1e6, (t1 - _NoLaunch.launched_at) * 1e6))
    return out


# -------------------------------------------------------------------------------------- stamps
STEPS = [  # (module path, qualified attribute, label): wrapped with perf_counter stamps
    ("libreyolo.engine.call_options", "PredictOptions.build", "options: PredictOptions.build"),
    ("libreyolo.engine.predictor", "apply_threads", "threads: apply_threads"),
    ("libreyolo.engine.predictor", "parse_color", "bgr: parse_color"),
    ("libreyolo.engine.predictor", "check_imgsz", "imgsz: check_imgsz"),
    ("libreyolo.engine.predictor", "Predictor.plan", "plan: task.plan"),
    ("libreyolo.engine.predictor", "resolve", "precision: resolve"),
    ("libreyolo.engine.predictor", "is_video_source", "source: is_video_source"),
    ("libreyolo.engine.predictor", "load_sources", "source: load_sources"),
    ("libreyolo.engine.predictor", "Predictor._upload", "upload: _upload"),
    ("libreyolo.engine.predictor", "Predictor.run_batch", "stage: run_batch (all)"),
    ("libreyolo.graphs.runner", "GraphRunner.__call__", "stage: runner (signature, replay, check)"),
    ("libreyolo.graphs.capture", "CapturedGraph.replay", "stage: replay (input copies)"),
    ("libreyolo.tasks.classify.task", "ClassifyPlan.results", "results: plan.results"),
    ("libreyolo.tasks.detect.task", "DetectPlan.results", "results: plan.results (detect)"),
    ("libreyolo.tasks.pose.task", "PosePlan.results", "results: plan.results (pose)"),
]


def _resolve(path: str, attr: str):
    import importlib
    mod = importlib.import_module(path)
    owner = mod
    *parents, name = attr.split(".")
    for p in parents:
        owner = getattr(owner, p)
    return owner, name


def stamp_steps(call, n: int) -> dict[str, float]:
    """Median host us per step of ``call()`` over ``n`` calls, each step timed where it is
    called (inclusive of what it calls); "total" is the whole call."""
    seen: dict[str, list[float]] = {label: [] for *_, label in STEPS}
    acc: dict[str, float] = {}
    saved = []
    for path, attr, label in STEPS:
        owner, name = _resolve(path, attr)
        orig = owner.__dict__[name] if name in getattr(owner, "__dict__", {}) else getattr(owner, name)
        saved.append((owner, name, orig))
        fn = orig.__func__ if isinstance(orig, (staticmethod, classmethod)) else orig

        def wrap(*a, _fn=fn, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_label] = acc.get(_label, 0.0) + (time.perf_counter() - t0) * 1e6
        if isinstance(orig, classmethod):
            wrapped = classmethod(wrap)
        elif isinstance(orig, staticmethod):
            wrapped = staticmethod(wrap)
        else:
            wrapped = wrap
        setattr(owner, name, wrapped)
    totals = []
    try:
        for _ in range(n):
            acc.clear()
            t0 = time.perf_counter()
            call()
            totals.append((time.perf_counter() - t0) * 1e6)
            for label in seen:
                seen[label].append(acc.get(label, 0.0))
    finally:
        for owner, name, orig in saved:
            setattr(owner, name, orig)
    out = {label: round(statistics.median(v), 1) for label, v in seen.items() if any(v)}
    out["total (with the stamps' own cost)"] = round(statistics.median(totals), 1)
    return out


def profile_top(call, n: int, top: int = 25) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        call()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs=2, default=["resnet", "18"])
    ap.add_argument("--imgsz", type=int, default=224)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=10, help="arms interleaved in this many blocks")
    ap.add_argument("--profile", type=int, default=300, help="calls per arm for the stamps and cProfile")
    ap.add_argument("--no-imgsz", action="store_true", help="call model(img, cuda_graph=True) without imgsz=")
    ap.add_argument("--rgb", action="store_true", help="the array said to be RGB (bgr=False): no channel reorder")
    ap.add_argument("--frame", action="store_true", help="the sample at its own 1280x720, not resized to imgsz")
    ap.add_argument("--task", default=None, help="the family's task variant (e.g. pose, segment)")
    ap.add_argument("--fuse", action="store_true", help="the model with its BatchNorms folded (model.fuse()): "
                    "fewer tensors for the graph's stale-weights fingerprint")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    m = LibreYOLO.new(*a.model, device="cpu", seed=0, task=a.task)
    if a.fuse:
        m.fuse()
    if m.task != "classify":   # an untrained head detects nothing: re-drawn (as bench does) for a full load
        from libreyolo.engine.verify import input_sensitive
        m = input_sensitive(m)
    m.runner.capturer = StubCapturer()
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    img = np.ascontiguousarray(np.asarray(pil if a.frame else pil.resize((a.imgsz, a.imgsz))))
    kw = {"cuda_graph": True} if a.no_imgsz else {"imgsz": a.imgsz, "cuda_graph": True}
    if a.rgb:
        kw["bgr"] = False

    def call():
        return m(img, **kw)

    eager = m(img, **{k: v for k, v in kw.items() if k != "cuda_graph"})
    arms = {"full": False, "reuse": True}
    try:
        set_reuse(m, True)
    except SystemExit:
        arms = {"full": False}
    for name, on in arms.items():   # the Results equal eager's on either arm (stage outputs kept by the stub)
        set_reuse(m, on)
        for _ in range(3):
            r = call()
        if eager.probs is not None:
            assert torch.equal(r.probs.data, eager.probs.data) and r.probs.top5 == eager.probs.top5, name
        else:   # a detector: its boxes
            assert torch.equal(r.boxes.data, eager.boxes.data), name
    times: dict[str, list[float]] = {k: [] for k in arms}
    splits: dict[str, list[tuple[float, float]]] = {k: [] for k in arms}
    per = max(1, a.runs // a.blocks)
    for _ in range(a.blocks):
        for name, on in arms.items():
            set_reuse(m, on)
            timed(call, 20)   # settle after the switch
            times[name] += timed(call, per, splits[name])
    rep = {"model": "-".join(a.model), "task": m.task, "imgsz": a.imgsz, "torch": torch.__version__, "threads": 1,
           "call": f"model(img uint8 {img.shape}, {', '.join(f'{k}={v}' for k, v in kw.items())})",
           "median_us": {k: round(statistics.median(v), 1) for k, v in times.items()},
           "before_launch_median_us": {k: round(statistics.median([b for b, _ in v]), 1) for k, v in splits.items()},
           "after_launch_median_us": {k: round(statistics.median([a for _, a in v]), 1) for k, v in splits.items()},
           "p10_us": {k: round(float(np.percentile(v, 10)), 1) for k, v in times.items()},
           "p90_us": {k: round(float(np.percentile(v, 90)), 1) for k, v in times.items()},
           "steps_us": {}, "captures": m.runner.capturer.captures}
    for name, on in arms.items():
        set_reuse(m, on)
        rep["steps_us"][name] = stamp_steps(call, a.profile)
    print(json.dumps(rep, indent=1))
    for name, on in arms.items():
        set_reuse(m, on)
        print(f"\n==== cProfile, arm {name}: {a.profile} calls, by own time ====")
        print(profile_top(call, a.profile))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
