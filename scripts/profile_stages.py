"""Where the GPU time of one graphed predict goes, piece by piece (GPU only).

    PYTHONPATH=. python3 scripts/profile_stages.py yolox:n rtdetr:r18 --out stages.json

For each family:size (untrained, seeded, batch 1, the 1280x720 sample, fp32): every piece
of the predict stage is captured in its own CUDA graph and its replay timed with CUDA
events (median of 200), so the figures are device time without Python or launch gaps:
letterbox, network, top-k candidates (and a full sort as the alternative), NMS with the
selection, and the whole stage; plus the host side: staging into pinned memory (numpy, and
torch's copy by thread count), the upload, and predict with each upload path, side by side. With
``--kernels`` a torch.profiler table of the eager network's kernels is written next to
the JSON (kernel count and the heaviest kernels).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.benchmark import time_call
from libreyolo.data.sources import load_sources
from libreyolo.ops import nms_graph
from libreyolo.ops.letterbox import letterbox
from libreyolo.ops.nms import top_candidates


def event_ms(replay, n: int = 200) -> float:
    """Median device time of ``replay()`` (a graph replay), by CUDA events around each of ``n``."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for _ in range(10):
        replay()
    for a, b in ev:
        a.record()
        replay()
        b.record()
    torch.cuda.synchronize()
    return round(statistics.median(a.elapsed_time(b) for a, b in ev), 4)


def graph_ms(fn, *args, n: int = 200) -> float:
    """Median device time of one replay of ``fn(*args)`` captured alone."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(*args)
    return event_ms(g.replay, n)


def host_ms(fn, n: int = 200) -> float:
    """Median wall time of ``fn()`` with the device synchronized after each call (10 warm-up calls)."""
    return round(time_call(fn, torch.device("cuda"), n, 10)["median_ms"], 4)


def side_by_side(arms: dict, rounds: int, n: int) -> dict:
    """``{name: fn}`` timed in alternating blocks of ``n`` calls, ``rounds`` rounds: median per arm."""
    times: dict = {k: [] for k in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            times[name].append(host_ms(fn, n=n))
    return {k: round(statistics.median(v), 4) for k, v in times.items()}


def predict_ladder(m, img, rounds: int = 5, n: int = 60) -> dict:
    """Where a graphed predict's wall time goes: the same call with one more piece removed on
    each rung, timed side by side (alternating blocks of ``n`` calls, ``rounds`` rounds, median).

    e2e: ``m(img, cuda_graph=True)``; device_src: the image already on the GPU (no upload, no
    host copy of it); run_batch: the predictor's stage call + the copy to the host (no source
    handling, no Results); replay_cpu: the cached graph's replay + the copy to the host (no
    runner); replay_pinned: the same copy into pinned memory; replay_sync: replay + synchronize;
    device: the graph's replay timed by CUDA events.
    """
    p = m.get_predictor()
    thr = p._thresholds(0.25, 0.45)
    geo = p._geometry((tuple(img.shape[:2]),), 640)
    post = p._post(300, False, None)
    for _ in range(3):
        m(img, cuda_graph=True)
    dev_img = p._upload(img).clone()
    torch.cuda.synchronize()
    entry = next(e for sig, e in m.runner._graphs.items() if sig[0][0] == "u8")
    g = entry.graph
    u8 = dev_img.unsqueeze(0)
    chw = dev_img.permute(2, 0, 1)  # a CHW view of the uploaded image (predict takes CHW tensors)
    pinned = torch.empty(g.static_outputs.shape, dtype=g.static_outputs.dtype, pin_memory=True)

    def replay_pinned():
        pinned.copy_(g.replay((u8, thr, geo), clone=False), non_blocking=True)
        torch.cuda.current_stream().synchronize()
        return pinned
    arms = {
        "e2e": lambda: m(img, cuda_graph=True),
        "device_src": lambda: m(chw, cuda_graph=True),
        "run_batch": lambda: p.run_batch([dev_img], 640, True, None, 1000, post, thr).cpu(),
        "replay_cpu": lambda: g.replay((u8, thr, geo), clone=False).cpu(),
        "replay_pinned": replay_pinned,
        "replay_sync": lambda: g.replay((u8, thr, geo), clone=False),
    }
    out = side_by_side(arms, rounds, n)
    out["device"] = event_ms(lambda: g.replay((u8, thr, geo), clone=False), 100)
    return out


def profile(spec: str, kernels: bool, out_prefix: str, ladder: bool = False) -> dict:
    fam, size = spec.split(":")
    m = LibreYOLO.new(fam, size, device="cuda", seed=0)
    img = load_sources(SAMPLE_IMAGE)[0].image
    p = m.get_predictor()
    thr = p._thresholds(0.25, 0.45)
    geo = p._geometry((tuple(img.shape[:2]),), 640)
    u8 = p._upload(img).unsqueeze(0)
    res: dict = {"spec": spec, "image": list(img.shape)}
    with torch.no_grad():
        x = letterbox(u8, 640, m.RESIZE)
        raw = m.infer(x)
        cand = top_candidates(*raw, 1000)
        res["letterbox_ms"] = graph_ms(letterbox, u8, 640, m.RESIZE)
        res["network_ms"] = graph_ms(m.infer, x)
        res["topk_ms"] = graph_ms(top_candidates, *raw, 1000)
        # the alternative candidate selection: one full sort, first 1000 (same order up to ties)
        k = min(1000, raw[1].shape[1])
        res["sort_first_k_ms"] = graph_ms(lambda s: s.sort(dim=1, descending=True)[0][:, :k], raw[1])
        res["topk_scores_only_ms"] = graph_ms(lambda s: s.topk(k, dim=1)[0], raw[1])
        boxes, scores, cls = cand
        res["candidates_above_conf"] = int((scores > 0.25).sum())
        # NMS (when the family has it) + selection + packing: everything after the top-k
        res["select_ms"] = graph_ms(lambda c, t: nms_graph.select_packed(*c, t, 300, nms=m.NMS), cand, thr)
        res["kept"] = int(nms_graph.select_packed(*cand, thr, 300, nms=m.NMS)[0, -1])
        post = p._post(300, False, None)
        stage = p._stage_fns(640, 1000, post)[1]
        res["whole_stage_ms"] = graph_ms(stage, u8, thr, geo)
        res["forward_stage_sum_ms"] = round(res["letterbox_ms"] + res["network_ms"] + res["topk_ms"]
                                            + res["select_ms"], 4)
    arr = np.ascontiguousarray(img)
    pinned = torch.empty(arr.shape, dtype=torch.uint8, pin_memory=True)
    src = torch.from_numpy(arr)
    threads = torch.get_num_threads()
    res["stage_np_copyto_ms"] = host_ms(lambda: np.copyto(pinned.numpy(), arr))
    for t in sorted({1, 2, 4, threads}):  # torch's copy into pinned memory by intra-op team size
        torch.set_num_threads(t)
        res[f"stage_torch_copy_{t}threads_ms"] = host_ms(lambda: pinned.copy_(src))
    torch.set_num_threads(threads)
    res["h2d_ms"] = host_ms(lambda: pinned.to("cuda", non_blocking=True))
    res["h2d_pageable_ms"] = host_ms(lambda: src.to("cuda", non_blocking=True))
    res["upload_ms"] = host_ms(lambda: p._upload(img))
    try:  # families not yet flagged for graphs refuse cuda_graph=True
        res["predict_graph_ms"] = host_ms(lambda: m(img, cuda_graph=True), n=150)
        # the two upload paths inside predict, side by side (alternating blocks of 50 calls)
        default = type(p).STAGE_MIN_THREADS

        def upload_arm(min_threads):
            def call():
                type(p).STAGE_MIN_THREADS = min_threads
                return m(img, cuda_graph=True)
            return call
        try:
            medians = side_by_side({"pinned": upload_arm(1), "direct": upload_arm(1 << 30)}, 4, 50)
        finally:
            type(p).STAGE_MIN_THREADS = default
        for name, v in medians.items():
            res[f"predict_graph_upload_{name}_ms"] = v
    except NotImplementedError as exc:
        res["predict_graph_ms"] = str(exc)
    res["torch_threads"] = torch.get_num_threads()
    if ladder:
        res["ladder"] = predict_ladder(m, img)
    if kernels:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as tprof
        with torch.no_grad(), tprof(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                stage(u8, thr, geo)
            torch.cuda.synchronize()
        try:
            table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=40)
        except Exception:  # older name
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)
        with open(f"{out_prefix}-{fam}{size}-kernels.txt", "w") as f:
            f.write(table)
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--ladder", action="store_true", help="where a graphed predict's wall time goes")
    ap.add_argument("--tf32", action="store_true", help="PyTorch's default TF32 convolutions (as bench)")
    a = ap.parse_args()
    if not a.tf32:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "models": [],
              "tf32": {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32}}
    for spec in a.specs:
        try:
            report["models"].append(profile(spec, a.kernels, a.out.rsplit(".", 1)[0], a.ladder))
        except Exception as exc:  # one model's failure must not hide the others
            report["models"].append({"spec": spec, "error": f"{type(exc).__name__}: {exc}"})
            print(spec, "ERROR", exc, flush=True)
        with open(a.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
