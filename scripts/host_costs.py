"""Host-side cost of each step of a graphed predict, in the cadence predict runs it (GPU only).

    PYTHONPATH=. python3 scripts/host_costs.py yolo7:tiny --out host.json

Each step is timed by perf_counter (median of ``--n``) right after the device has been busy
for about as long as a small detector's forward (a ~1.3 ms sleep kernel, then a synchronize),
as in back-to-back predict calls: worker threads that went to sleep during the wait must wake.
Host times only, no synchronize after a step unless it names one.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.data.sources import load_sources
from libreyolo.engine.verify import input_sensitive
from libreyolo.ops.letterbox import letterbox_params, unletterbox_boxes


def busy_device(us: float = 1300.0) -> None:
    torch.cuda._sleep(int(us * 1.98e3))  # cycles at the H200's ~1.98 GHz: roughly ``us``
    torch.cuda.synchronize()


def after_idle(fn, n: int, setup=None) -> float:
    """Median host time (us) of ``fn()`` called right after a busy device and a synchronize."""
    out = []
    for _i in range(n + 10):
        if setup is not None:
            setup()
        busy_device()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(out[10:]), 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=200)
    a = ap.parse_args()
    n = a.n
    dev = torch.device("cuda")
    img = load_sources(SAMPLE_IMAGE)[0].image
    arr = np.ascontiguousarray(img)
    src = torch.from_numpy(arr)
    pinned = torch.empty(src.shape, dtype=torch.uint8, pin_memory=True)
    dbuf = torch.empty(src.shape, dtype=torch.uint8, device=dev)
    ev = torch.cuda.Event()
    ev.record()
    threads = torch.get_num_threads()
    r: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "torch_threads": threads, "cpus": __import__("os").cpu_count()}
    # --- upload, step by step
    r["from_numpy_us"] = after_idle(lambda: torch.from_numpy(np.ascontiguousarray(img)), n)
    r["event_synchronize_us"] = after_idle(ev.synchronize, n)
    for t in sorted({1, 4, 8, threads}):
        torch.set_num_threads(t)
        r[f"pinned_copy_{t}threads_us"] = after_idle(lambda: pinned.copy_(src), n)
    torch.set_num_threads(threads)
    r["pinned_copy_back_to_back_us"] = round(statistics.median(
        [(lambda t0: (pinned.copy_(src), (time.perf_counter() - t0) * 1e6)[1])(time.perf_counter()) for _ in range(n)]), 1)
    r["np_copyto_pinned_us"] = after_idle(lambda: np.copyto(pinned.numpy(), arr), n)
    r["pinned_empty_us"] = after_idle(lambda: torch.empty(src.shape, dtype=torch.uint8, pin_memory=True), n)
    r["h2d_new_tensor_us"] = after_idle(lambda: pinned.to(dev, non_blocking=True), n)
    r["h2d_into_buffer_us"] = after_idle(lambda: dbuf.copy_(pinned, non_blocking=True), n)
    r["current_stream_us"] = after_idle(lambda: torch.cuda.current_stream(dev), n)
    s = torch.cuda.current_stream(dev)
    r["event_record_us"] = after_idle(lambda: ev.record(s), n)
    m = input_sensitive(LibreYOLO.new(*a.spec.split(":"), device="cuda", seed=0))
    p = m.get_predictor()
    r["predictor_upload_us"] = after_idle(lambda: p._upload(img), n)
    # --- bookkeeping around the stage
    thr = p._thresholds(0.25, 0.45)
    geo = p._geometry((tuple(img.shape[:2]),), 640)
    post = p._post(300, False, None)
    for _ in range(5):
        m(img, cuda_graph=True)
    u8 = p._upload(img).unsqueeze(0)
    key = ("u8", 640, 1000, "post", 300, False)
    r["letterbox_params_us"] = after_idle(lambda: letterbox_params(720, 1280, 640, m.RESIZE), n)

    def autocast_off():
        with torch.no_grad(), p._autocast(None):
            pass
    r["no_grad_autocast_off_us"] = after_idle(autocast_off, n)
    r["signature_us"] = after_idle(lambda: m.runner.signature(key, (u8, thr, geo)), n)
    r["has_graph_us"] = after_idle(lambda: m.runner.has_graph(key, (u8, thr, geo)), n)
    r["fingerprint_us"] = after_idle(m.runner.fingerprint, n)
    fn = p._stage_fns(640, 1000, post)[1]
    r["runner_call_us"] = after_idle(lambda: m.runner(key, fn, (u8, thr, geo), True), n)
    r["run_batch_us"] = after_idle(lambda: p.run_batch([u8[0]], 640, True, None, 1000, post, thr), n)
    g = next(e.graph for sig, e in m.runner._graphs.items() if sig[0] == key)
    r["static_input_copy_u8_us"] = after_idle(lambda: g.static_inputs[0].copy_(u8, non_blocking=True), n)
    r["static_input_copy_thr_us"] = after_idle(lambda: g.static_inputs[1].copy_(thr, non_blocking=True), n)
    r["graph_launch_us"] = after_idle(g.graph.replay, n)
    r["clone_output_us"] = after_idle(lambda: g.static_outputs.clone(), n)
    out_pinned = torch.empty(g.static_outputs.shape, dtype=g.static_outputs.dtype, pin_memory=True)
    r["d2h_pageable_sync_us"] = after_idle(lambda: g.static_outputs.cpu(), n)
    r["d2h_pinned_async_us"] = after_idle(lambda: out_pinned.copy_(g.static_outputs, non_blocking=True), n)
    r["d2h_pinned_async_then_event_sync_us"] = after_idle(
        lambda: (out_pinned.copy_(g.static_outputs, non_blocking=True), ev.record(), ev.synchronize()), n)
    # --- host post-processing (the numbers of one call)
    host = m(img, cuda_graph=True).boxes.data.numpy().copy()
    r["unletterbox_us"] = after_idle(lambda: unletterbox_boxes(host.copy(), 0.5, 0.5, 720, 1280, 0, 0), n)
    r["copy_300x6_us"] = after_idle(lambda: host.copy(), n)
    r["predict_graph_us"] = after_idle(lambda: m(img, cuda_graph=True), n)
    r["load_sources_us"] = after_idle(lambda: load_sources(img, borrow=True), n)
    print(json.dumps(r, indent=1), flush=True)
    with open(a.out, "w") as f:
        json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
