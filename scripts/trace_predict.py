"""Timeline of graphed predict calls: host phases, CUDA API calls and device work (GPU only).

    PYTHONPATH=. python3 scripts/trace_predict.py yolo7:tiny yolox:n --out traces/

For each family:size (prepared as ``libreyolo bench`` prepares it: seeded, input-sensitive
head, the 1280x720 sample, batch 1, 640), ``--calls`` graphed predict calls are recorded by
torch.profiler (CPU and CUDA) with the predictor's phases marked (load_sources, _upload,
run_batch, the runner, the replay, own, the Results). Written per model: the Chrome trace
(``trace-<family><size>.json``, open it in Perfetto) and, in ``summary.json``, per phase the
median offset from the call's start and duration on the host, the device's busy time and its
idle gaps (time the GPU waited for the host), the CUDA API calls, and the call's wall time.
The profiler's own overhead lengthens host phases by a few microseconds each: read the
shares, not the absolute figures; ``libreyolo bench`` gives those.

Also measured (device time, CUDA events, median of 200 replays of each piece captured alone):
the letterbox, the network with and without its decoder, and the candidate sort variants.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections import Counter
from pathlib import Path

import torch
from profile_stages import graph_ms  # scripts/ is on the path when this file runs
from torch.profiler import ProfilerActivity, profile, record_function

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.data import sources
from libreyolo.engine import predictor as predictor_mod
from libreyolo.engine.verify import input_sensitive
from libreyolo.graphs import capture as capture_mod
from libreyolo.graphs import runner as runner_mod
from libreyolo.ops.letterbox import letterbox
from libreyolo.ops.nms import top_candidates

PHASES = {  # (owner, attribute) -> range name
    (predictor_mod, "load_sources"): "load_sources",
    (predictor_mod.Predictor, "_upload"): "upload",
    (predictor_mod.Predictor, "run_batch"): "run_batch",
    (runner_mod.GraphRunner, "__call__"): "runner",
    (runner_mod.GraphRunner, "fingerprint"): "fingerprint",
    (capture_mod.CapturedGraph, "replay"): "replay",
    (sources.SourceItem, "own"): "own",
    (predictor_mod, "unletterbox_boxes"): "unletterbox",
    (predictor_mod.Results, "__init__"): "results",
}


STAMPS: list = []      # (label, perf_counter) of the call being stamped
EVENTS: list = []      # (label, CUDA event) recorded on the current stream


def mark_phases(how: str) -> None:
    """Wrap each phase: ``how="profiler"`` marks a torch.profiler range, ``"stamps"`` records
    perf_counter at entry and exit (and, around the replay, a CUDA event: when the device got
    there)."""
    for (owner, name), label in PHASES.items():
        fn = getattr(owner, name)
        if how == "profiler":
            def wrapped(*a, __fn=fn, __label=label, **k):
                with record_function(f"phase:{__label}"):
                    return __fn(*a, **k)
        else:
            def wrapped(*a, __fn=fn, __label=label, **k):
                if __label == "replay":
                    ev = torch.cuda.Event(enable_timing=True)
                    ev.record()
                    EVENTS.append(("device reached replay", ev))
                STAMPS.append((f"{__label} >", time.perf_counter()))
                out = __fn(*a, **k)
                STAMPS.append((f"{__label} <", time.perf_counter()))
                if __label == "replay":
                    ev = torch.cuda.Event(enable_timing=True)
                    ev.record()
                    EVENTS.append(("device ended replay", ev))
                return out
        setattr(owner, name, functools.wraps(fn)(wrapped))


def stamped_calls(call, n: int) -> dict:
    """Median host offsets (us from the call's start) of every phase entry/exit, and when the
    device reached the replay and ended it, over ``n`` calls (each followed by a synchronize)."""
    rows: dict = {}
    for _ in range(n + 10):
        STAMPS.clear()
        EVENTS.clear()
        e0 = torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        seen: Counter = Counter()
        for label, t in STAMPS:
            seen[label] += 1
            rows.setdefault(f"{label}#{seen[label]}", []).append((t - t0) * 1e6)
        for label, ev in EVENTS:
            rows.setdefault(f"[{label}]", []).append(e0.elapsed_time(ev) * 1e3)
        rows.setdefault("call end", []).append((t1 - t0) * 1e6)
    return {k: round(statistics.median(v[10:]), 1) for k, v in sorted(rows.items(), key=lambda kv: statistics.median(kv[1]))}


def summarize(trace_path: Path) -> dict:
    ev = [e for e in json.loads(trace_path.read_text())["traceEvents"] if e.get("ph") == "X"]
    calls = sorted((e for e in ev if e["name"] == "call" and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    dev = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    rows: dict = {}
    for c in calls:
        t0, t1 = c["ts"], c["ts"] + c["dur"]
        inside = [e for e in ev if t0 <= e["ts"] <= t1 and e is not c]
        for e in inside:
            if e["name"].startswith("phase:") or e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
                r = rows.setdefault(e["name"], {"start_us": [], "dur_us": []})
                r["start_us"].append(e["ts"] - t0)
                r["dur_us"].append(e["dur"])
        # device work launched by this call: its activities that start within the call
        d = [e for e in dev if t0 <= e["ts"] < t1]
        if d:
            busy = sum(e["dur"] for e in d)
            gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(d, d[1:])]
            r = rows.setdefault("device", {"first_start_us": [], "last_end_us": [], "busy_us": [], "gap_us": [],
                                           "big_gaps": [], "activities": []})
            r["first_start_us"].append(d[0]["ts"] - t0)
            r["last_end_us"].append(d[-1]["ts"] + d[-1]["dur"] - t0)
            r["busy_us"].append(busy)
            r["gap_us"].append(sum(g for g in gaps if g > 0))
            r["big_gaps"].append([(round(g, 1), d[i]["name"][:40], d[i + 1]["name"][:40])
                                  for i, g in enumerate(gaps) if g > 8])
            r["activities"].append(len(d))
        rows.setdefault("call", {"dur_us": []})["dur_us"].append(c["dur"])
    out = {}
    for name, r in rows.items():
        out[name] = {k: (round(statistics.median(v), 2) if v and not isinstance(v[0], list) else v[-1] if v else None)
                     for k, v in r.items()}
        if "dur_us" in r:
            out[name]["per_call"] = round(len(r["dur_us"]) / max(1, len(calls)), 2)
    return out


def warm(spec: str, img, calls: int = 30):
    """The model ``libreyolo bench`` would time (seeded, input-sensitive head), after ``calls``
    graphed predicts of ``img``."""
    model = input_sensitive(LibreYOLO.new(*spec.split(":"), device="cuda", seed=0))
    for _ in range(calls):
        model(img, cuda_graph=True)
    torch.cuda.synchronize()
    return model


def pieces(m, img) -> dict:
    p = m.get_predictor()
    u8 = p._upload(img).unsqueeze(0).clone()
    res = {}
    with torch.no_grad():
        res["letterbox_ms"] = graph_ms(letterbox, u8, 640, m.RESIZE)
        x = letterbox(u8, 640, m.RESIZE)
        raw = m.infer(x)
        s = raw[1]
        k = min(1000, s.shape[1])
        res["anchors"] = s.shape[1]
        res["top_candidates_ms"] = graph_ms(top_candidates, *raw, 1000)
        res["sort_rows_ms"] = graph_ms(lambda t: t.sort(dim=1, descending=True), s)
        res["sort_flat_ms"] = graph_ms(lambda t: t.view(-1).sort(descending=True), s)
        res["sort_rows_stable_ms"] = graph_ms(lambda t: t.sort(dim=1, descending=True, stable=True), s)
        res["topk_sorted_ms"] = graph_ms(lambda t: t.topk(k, dim=1), s)
        res["gathers_ms"] = graph_ms(lambda b, c, i: (b.gather(1, i.unsqueeze(-1).expand(-1, -1, 4)), c.gather(1, i)),
                                     raw[0], raw[2], s.sort(dim=1, descending=True)[1][:, :k])
        res["infer_ms"] = graph_ms(m.infer, x)
        res["network_only_ms"] = graph_ms(m.model, x)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=30, help="profiled calls per model")
    ap.add_argument("--stamps", type=int, default=300, help="stamped calls per model")
    ap.add_argument("--profiler", action="store_true", help="also write torch.profiler Chrome traces")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "torch_threads": torch.get_num_threads(), "models": {}}
    img = sources.load_sources(SAMPLE_IMAGE)[0].image
    for spec in a.specs:
        m = warm(spec, img)
        wall = []
        for _ in range(200):
            t0 = time.perf_counter()
            m(img, cuda_graph=True)
            wall.append((time.perf_counter() - t0) * 1e3)
        entry = {"predict_graph_ms_unprofiled": round(statistics.median(wall), 4), "pieces": pieces(m, img)}
        report["models"][spec] = entry
        print(spec, json.dumps(entry), flush=True)
        (out / "summary.json").write_text(json.dumps(report, indent=1))
    mark_phases("stamps")
    for spec in a.specs:
        m = report["models"][spec]
        model = warm(spec, img)
        chw = model.get_predictor()._upload(img).permute(2, 0, 1).clone()
        for _ in range(30):
            model(chw, cuda_graph=True)
        m["stamps_numpy_source"] = stamped_calls(lambda: model(img, cuda_graph=True), a.stamps)
        m["stamps_cuda_tensor_source"] = stamped_calls(lambda: model(chw, cuda_graph=True), a.stamps)
        print(spec, json.dumps({k: m[k] for k in ("stamps_numpy_source", "stamps_cuda_tensor_source")}), flush=True)
        (out / "summary.json").write_text(json.dumps(report, indent=1))
    if not a.profiler:
        return
    for (owner, name) in PHASES:  # back to the plain functions, then profiler ranges
        setattr(owner, name, getattr(owner, name).__wrapped__)
    mark_phases("profiler")
    for spec in a.specs:
        m = warm(spec, img)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(a.calls):
                with record_function("call"):
                    m(img, cuda_graph=True)
                torch.cuda.synchronize()
        path = out / f"trace-{spec.replace(':', '')}.json"
        prof.export_chrome_trace(str(path))
        report["models"][spec]["timeline"] = summarize(path)
        print(spec, json.dumps(report["models"][spec]["timeline"]), flush=True)
        (out / "summary.json").write_text(json.dumps(report, indent=1))

if __name__ == "__main__":
    main()
