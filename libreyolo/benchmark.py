"""The harness behind ``libreyolo bench``: one process, every arm side by side.

Arms: eager forward, graphed forward (replay of the captured network; for a family with a
predict seam, the replayed front part + the eager rest, and as an experiment the whole network
captured, with whether it replays bitwise), end-to-end predict eager and with
``cuda_graph=True`` (uint8 numpy image in, Results out), and the capture time. On CUDA also the
compile arms (:func:`compile_arms_for`): ``torch.compile(mode="reduce-overhead")`` of the same
fp32 network (what a PyTorch user tries first), the half path (``precision``, eager copy in our
graph) and the fast path (inductor-compiled half copy in our graph), forward and end to end, with
first-compile and warm-start (second process) times. With ``batch`` > 1 also the batch arms
(:func:`batch_arms`): images/s of predict over several batches per call, eager, graph and fast.
Each arm is warmed up, then timed ``runs`` times with a device synchronize around every call;
medians (and p90) are reported.
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .graphs.capture import CudaGraphCapturer
from .graphs.parity import all_equal, clone_outputs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device, runs: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return {"median_ms": statistics.median(samples), "p90_ms": samples[int(0.9 * (len(samples) - 1))],
            "min_ms": samples[0], "runs": runs}


def event_time_call(fn: Callable[[], Any], runs: int, warmup: int) -> dict:
    """:func:`time_call` on the device's clock: CUDA events recorded around each call (on the
    current stream), so a launch-bound call is timed by what its kernels took, not the host."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    samples.sort()
    return {"median_ms": statistics.median(samples), "p90_ms": samples[int(0.9 * (len(samples) - 1))],
            "min_ms": samples[0], "runs": runs}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _result_data(r) -> torch.Tensor:
    """The tensor a task's Results holds (boxes, probs or masks), for equality checks."""
    for field in ("boxes", *r.FIELDS):   # OCR: TextLines.data (corners, confidences)
        v = getattr(r, field)
        if v is not None:
            return torch.as_tensor(v.data)
    raise ValueError("a Results with no data field")


def _whole_graph_arm(net, x: torch.Tensor, eager_out: list, dev: torch.device, runs: int, warmup: int) -> dict:
    """For a family with a predict seam: the whole network captured anyway (not what predict
    does), timed, with whether its replay equals eager bit for bit - or why it could not run."""
    try:
        graph = CudaGraphCapturer().capture(lambda t: net(t), (x,), module=net)
        timing = time_call(lambda: graph.replay((x,), clone=False), dev, runs, warmup)
        return {**timing, "bitwise_equal_eager": all_equal(clone_outputs(graph.replay((x,), clone=False)), eager_out)}
    except Exception as exc:  # the experiment failing is a result, not an error
        return {"error": f"{type(exc).__name__}: {exc}"}


def bench_model(model, *, imgsz: int = 640, batch: int = 1, runs: int = 200, warmup: int = 30,
                image: np.ndarray | None = None, conf: float = 0.25, precision: str = "fp16",
                compile_arms: bool = True, chunks: int = 4, aot: bool = False) -> dict:
    """Measure every arm for ``model`` and return a JSON-ready dict (``conf``: detection only;
    ``precision``: the dtype of the half and fast arms; ``compile_arms``: run them, CUDA only;
    ``aot``: with them the ahead-of-time fast arm (``fast="aot"``, its package build and warm start);
    ``chunks``: with ``batch`` > 1, the batch arms predict ``chunks * batch`` images per call:
    :func:`batch_arms`)."""
    from .assets import SAMPLE_IMAGE
    from .data.sources import load_sources
    from .engine.verify import input_sensitive
    dev = model.device
    # An untrained head detects nothing, which would leave NMS idle: re-draw its biases
    # (seeded) so that post-processing has a full load; detections per image are reported.
    model = input_sensitive(model)
    opts = {"conf": conf} if "conf" in model.task_def.predict_defaults else {}
    opts.update(model.task_def.bench_options(model))   # e.g. segment-prompt: the prompt its family takes
    task_input = None   # a task's own bench input, described (OCR: the printed page)
    if image is None:   # a task's own input (OCR: a printed page) and the options it needs
        image, task_opts, task_input = model.task_def.bench_setup(model, imgsz)
        opts.update(task_opts)
    if image is None:
        image = load_sources(SAMPLE_IMAGE)[0].image
    images = [image] * batch
    net = model.model.eval()
    x = torch.rand((batch, 3, imgsz, imgsz), generator=torch.Generator().manual_seed(0)).to(dev)
    arms: dict[str, Any] = {}
    with torch.no_grad():
        arms["forward_eager"] = time_call(lambda: net(x), dev, runs, warmup)
    arms["predict_eager"] = time_call(lambda: model.predict(images, imgsz=imgsz, batch=batch, **opts),
                                      dev, runs, warmup)
    first = model.predict(images, imgsz=imgsz, batch=batch, **opts)
    dets = sum(len(r) for r in first) / batch  # boxes only
    lines = sum(len(r.texts) for r in first) / batch if first and first[0].texts is not None else None
    seam = bool(model.PREDICT_SEAM)
    if dev.type == "cuda" and model.SUPPORTS_CUDA_GRAPH:
        with torch.no_grad():
            eager_out = clone_outputs(net(x))
            if seam:   # what predict captures: the front part; the rest runs eager after its replay
                t0 = time.perf_counter()
                graph = CudaGraphCapturer().capture(lambda t: model.infer_front(t), (x,), module=net)
                capture_ms = (time.perf_counter() - t0) * 1e3

                def forward_graph():
                    return model.infer_back(*graph.replay((x,), clone=False))
                arms["forward_graph_front_only"] = time_call(lambda: graph.replay((x,), clone=False), dev, runs,
                                                             warmup)
            else:
                t0 = time.perf_counter()
                graph = CudaGraphCapturer().capture(lambda t: net(t), (x,), module=net)
                capture_ms = (time.perf_counter() - t0) * 1e3

                def forward_graph():
                    return graph.replay((x,), clone=False)
            arms["forward_graph"] = time_call(forward_graph, dev, runs, warmup)
            same = all_equal(clone_outputs(forward_graph()), eager_out)
        del graph
        model.release_graphs()
        t0 = time.perf_counter()
        model.predict(images, imgsz=imgsz, batch=batch, **opts, cuda_graph=True)
        model.predict(images, imgsz=imgsz, batch=batch, **opts, cuda_graph=True)
        first_calls_ms = (time.perf_counter() - t0) * 1e3
        arms["predict_graph"] = time_call(
            lambda: model.predict(images, imgsz=imgsz, batch=batch, **opts, cuda_graph=True), dev, runs, warmup)
        # Where the end-to-end time goes: the same call with the device synchronized between
        # stages (ms per image, medians over the runs).
        stages: dict[str, list[float]] = {}
        for _ in range(max(20, runs // 4)):
            for k, v in model.predict(images, imgsz=imgsz, batch=batch, **opts, cuda_graph=True,
                                      profile=True)[0].speed.items():
                stages.setdefault(k, []).append(v)
        arms["predict_graph_stages_ms_per_image"] = {k: statistics.median(v) for k, v in stages.items()}
        info = model.graph_info()
        arms["capture"] = {"forward_ms": capture_ms, "predict_first_two_calls_ms": first_calls_ms,
                           "predict_graphs": [{"stage": g["stage"], "capture_ms": g["capture_ms"]}
                                              for g in info["graphs"]]}
        arms["forward_graph_bitwise_equal_eager"] = bool(same)
        ref_eager = model.predict(images, imgsz=imgsz, batch=batch, **opts, cuda_graph=False)
        ref_graph = model.predict(images, imgsz=imgsz, batch=batch, **opts, cuda_graph=True)
        arms["predict_graph_equal_eager"] = all(torch.equal(_result_data(a), _result_data(b))
                                                for a, b in zip(ref_eager, ref_graph))
        model.release_graphs()
        if seam:   # last: a capture that fails here must not disturb the arms above
            with torch.no_grad():
                arms["forward_whole_graph"] = _whole_graph_arm(net, x, eager_out, dev, runs, warmup)
    # the task's own arms (segment-prompt: the image stage alone and a prompt call on a set image)
    arms.update(model.task_def.bench_arms(model, image, runs, warmup, imgsz, time_call))
    notes: list[str] = []
    if compile_arms:
        why = _compile_arms_skipped(model, precision)
        if why:
            notes.append(f"compile / half / fast arms skipped: {why}")
        else:
            arms.update(compile_arms_for(model, x, images, imgsz, batch, opts, runs, warmup, precision, aot))
    if batch > 1:
        batch_res, batch_notes = batch_arms(model, image, imgsz, batch, opts, runs, warmup, precision, chunks)
        arms.update(batch_res)
        notes.extend(batch_notes)
    result = {
        "model": f"{model.FAMILY}-{model.size}", "task": model.TASK,
        "captured": "front part (seam), rest eager" if seam else "whole stage", "fused": model.fused, "trained": model.trained, "imgsz": imgsz,
        "batch": batch,
        "image_hw": list(image.shape[:2]), "detections_per_image": dets,
        **({} if lines is None else {"text_lines_per_image": lines}),
        **({} if task_input is None else {"task_input": task_input}),
        "device": device_name(dev), "torch": torch.__version__,
        "cuda": torch.version.cuda, "date": _dt.date.today().isoformat(), "runs": runs, "warmup": warmup,
        # float32 convolutions run as TF32 on Ampere and later unless disabled (PyTorch's default: on)
        "tf32": {"cudnn": bool(torch.backends.cudnn.allow_tf32), "matmul": bool(torch.backends.cuda.matmul.allow_tf32)},
        "arms": arms,
        "notes": notes,
    }
    fe, fg = arms["forward_eager"]["median_ms"], arms.get("forward_graph", {}).get("median_ms")
    pe, pg = arms["predict_eager"]["median_ms"], arms.get("predict_graph", {}).get("median_ms")
    result["ratios"] = {
        "forward_speedup": fe / fg if fg else None,
        "predict_speedup": pe / pg if pg else None,
        "predict_graph_over_forward_graph": pg / fg if fg and pg else None,
    }
    ff = arms.get("forward_fast_graph", {}).get("median_ms")
    if ff and fg:
        result["ratios"]["fast_forward_over_fp32_forward_graph"] = ff / fg
    if "batch_eager" in arms:
        be, bg = arms["batch_eager"], arms.get("batch_graph")
        result["ratios"]["batch_graph_over_eager_images_per_s"] = (bg["images_per_s"] / be["images_per_s"]
                                                                   if bg else None)
        result["ratios"]["batch_graph_ms_per_batch_over_forward_graph"] = (bg["ms_per_batch"] / fg
                                                                          if bg and fg else None)
    return result


def batch_arms(model, image: np.ndarray, imgsz: int, batch: int, opts: dict, runs: int, warmup: int,
               precision: str = "fp16", chunks: int = 4) -> tuple[dict, list[str]]:
    """Throughput of batched predict: ``model.predict`` of ``chunks * batch`` copies of the
    uint8 ``image`` with ``batch=batch`` per call - so each call overlaps the upload of chunk
    i+1 with the stage of chunk i, as predict on a directory does - eager, with
    ``cuda_graph=True`` and on the fast path (CUDA, and only where the family's fast-path
    contract allows it: otherwise a note says why). Each arm: the call's median and p90 (ms),
    ``images_per_s`` and ``ms_per_batch`` (median / chunks). Returns (arms, notes)."""
    from .engine.fastpath import check_contract
    dev = model.device
    images = [image] * (batch * chunks)
    arms: dict[str, Any] = {}
    notes: list[str] = []
    kinds: list[tuple[str, dict]] = [("eager", {"cuda_graph": False})]
    if dev.type == "cuda" and model.SUPPORTS_CUDA_GRAPH:
        kinds.append(("graph", {"cuda_graph": True}))
        fast_precision = precision if precision in ("fp16", "bf16") else "fp16"
        try:
            if model.PREDICT_SEAM:
                raise ValueError(f"{model.FAMILY}'s predict stage has a seam (the fast path covers whole-stage "
                                 "families)")
            check_contract(model.FAMILY, fast_precision, True)
            kinds.append(("fast", {"cuda_graph": True, "precision": fast_precision, "fast": True}))
        except (ValueError, NotImplementedError) as exc:
            notes.append(f"batch fast arm skipped: {exc}")
    else:
        notes.append("batch graph and fast arms skipped: " + ("no CUDA device" if dev.type != "cuda"
                                                              else f"{model.FAMILY} is not graph-capturable"))
    for name, kw in kinds:
        model.release_graphs()

        def call(kw=kw):
            return model.predict(images, imgsz=imgsz, batch=batch, **opts, **kw)
        call()   # captures (graph, fast) and compiles (fast) happen here, untimed
        t = time_call(call, dev, runs, warmup)
        arms[f"batch_{name}"] = {**t, "images": len(images), "batch": batch, "chunks": chunks,
                                 "images_per_s": len(images) * 1e3 / t["median_ms"],
                                 "ms_per_batch": t["median_ms"] / chunks}
    model.release_graphs()
    return arms, notes


def _compile_arms_skipped(model, precision: str) -> str | None:
    """Why the compile arms cannot run here (None: they can)."""
    if model.device.type != "cuda":
        return "no CUDA device (torch.compile's reduce-overhead and the fast path are CUDA-graph arms)"
    if model.TASK != "detect":
        return f"the half / fast path covers detection; {model.FAMILY} is a {model.TASK} model"
    if not model.SUPPORTS_CUDA_GRAPH:
        return f"{model.FAMILY} is not graph-capturable"
    if model.PREDICT_SEAM:
        return f"{model.FAMILY}'s predict stage has a seam (the half path covers whole-stage families)"
    if precision == "fp32":
        return "precision=fp32 (the half and fast arms need fp16 or bf16)"
    return None


def compile_arms_for(model, x: torch.Tensor, images: list, imgsz: int, batch: int, opts: dict, runs: int,
                     warmup: int, precision: str, aot: bool = False) -> dict:
    """The arms beside the fp32 graph (CUDA): reduce-overhead, half, fast (torch.compile) and with
    ``aot`` the ahead-of-time compiled fast path (AOTInductor); compile and warm-start times. The
    fast path is measured here whatever the family's contract says (``measuring``)."""
    from .engine.fastpath import half_network, measuring
    dev = model.device
    net = model.model.eval()
    arms: dict[str, Any] = {}
    compile_s: dict[str, Any] = {}
    with torch.no_grad():
        # what a PyTorch user tries first: cudagraph trees around inductor's kernels, fp32
        t0 = time.perf_counter()
        ro = torch.compile(net, mode="reduce-overhead")
        for _ in range(3):   # cudagraph trees record on the first calls
            ro(x)
        _sync(dev)
        compile_s["reduce_overhead_first_calls_s"] = time.perf_counter() - t0
        arms["forward_compile_reduce_overhead"] = time_call(lambda: ro(x), dev, runs, warmup)
        ro = None   # its cudagraph trees go with it
        torch._dynamo.reset()
        for fast in (False, True, "aot") if aot else (False, True):
            name = {False: "half", True: "fast", "aot": "aot"}[fast]
            hn = half_network(model, precision, fast)
            xh = x.to(hn.dtype, memory_format=torch.channels_last)
            t0 = time.perf_counter()
            hn(xh)
            _sync(dev)
            if fast:
                compile_s[f"{name}_first_compile_s"] = time.perf_counter() - t0
                # a warm cache (an earlier run) makes this a cache hit (a package load), not a compile
                compile_s[f"{name}_first_compile_cache"] = hn.first_call_cache
                compile_s[f"{name}_cache_dir"] = str(hn.cache_dir)
            graph = CudaGraphCapturer().capture(lambda t: hn(t), (xh,), module=hn.net)
            arms[f"forward_{name}_graph"] = time_call(lambda: graph.replay((xh,), clone=False), dev, runs, warmup)
            eager = clone_outputs(hn(xh))
            arms[f"forward_{name}_graph_bitwise_equal_eager"] = all_equal(clone_outputs(graph.replay((xh,), clone=False)),
                                                                          eager)
            graph = None
            with measuring():
                kw = dict(imgsz=imgsz, batch=batch, **opts, cuda_graph=True, precision=precision, fast=fast)
                model.predict(images, **kw)
                arms[f"predict_{name}_graph"] = time_call(lambda: model.predict(images, **kw), dev, runs, warmup)
            model.release_graphs()
    compile_s["fast_compile_mode"] = hn.compile_mode
    compile_s.update(warm_start(model, imgsz, precision))
    if aot:
        compile_s.update({f"aot_{k}": v for k, v in warm_start(model, imgsz, precision, "aot").items()})
    arms["compile"] = compile_s
    return arms


_WARM_START = """
import time
t0 = time.perf_counter()
import json, sys
from libreyolo import LibreYOLO, SAMPLE_IMAGE
from libreyolo.engine import fastpath
from libreyolo.engine.fastpath import measuring
src, imgsz, precision, fastpath.COMPILE_MODE, fast = sys.argv[1:6]
fast = fastpath.parse_fast(fast)
m = LibreYOLO(src, device="cuda")
t1 = time.perf_counter()
with measuring():
    m.predict(SAMPLE_IMAGE, imgsz=int(imgsz), precision=precision, fast=fast, cuda_graph=True)
t2 = time.perf_counter()
hn = m.__dict__["_half_networks"][(precision, fast)]
print("WARM " + json.dumps({"first_result_s": t2 - t0, "first_predict_s": t2 - t1, "import_build_s": t1 - t0,
                            "compiled_first_call_s": hn.first_call_s, "cache": hn.first_call_cache,
                            "cache_dir": str(hn.cache_dir)}))
"""


def warm_start(model, imgsz: int, precision: str, fast: bool | str = True) -> dict:
    """A second process's time to its first fast-path result (inductor's caches, or with
    ``fast="aot"`` the package, are on disk now): from interpreter start and from the model being
    loaded. The child loads this model's weights as they are now (a temporary checkpoint: the
    bench re-draws an untrained head, and an "aot" package is keyed by the weights), after a
    batch-1 predict here has put what it needs on disk."""
    import subprocess
    import sys
    import tempfile

    from .assets import SAMPLE_IMAGE
    from .engine import fastpath
    with fastpath.measuring():
        model.predict(SAMPLE_IMAGE, imgsz=int(imgsz), precision=precision, fast=fast, cuda_graph=True)
    model.release_graphs()
    with tempfile.TemporaryDirectory() as tmp:
        src = str(model.save(Path(tmp) / f"{model.FAMILY}-{model.size}.pt"))
        cmd = [sys.executable, "-c", _WARM_START, src, str(imgsz), precision, fastpath.COMPILE_MODE, str(fast)]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return {"warm_start_error": "timed out after 600 s"}
        wall = time.perf_counter() - t0
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("WARM ")]
    if p.returncode or not line:
        return {"warm_start_error": (p.stderr or p.stdout)[-500:]}
    got = json.loads(line[-1][5:])
    return {"warm_start_process_s": wall, "warm_start_first_result_s": got["first_result_s"],
            "warm_start_first_predict_s": got["first_predict_s"], "warm_start_import_build_s": got["import_build_s"],
            "warm_start_compiled_first_call_s": got["compiled_first_call_s"],
            "warm_start_cache": got["cache"], "warm_start_cache_dir": got["cache_dir"]}


def write_json(result: dict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(p)
    return p


def bench_video(model, source: Any, *, imgsz: int = 640, frames: int = 300, conf: float = 0.25,
                warmup: int = 5) -> dict:
    """Frames per second on a video (``libreyolo bench source=clip.mp4``), decode reported apart.

    * ``decode``: PyAV decoding + RGB conversion of the first ``frames`` frames alone (the reader
      thread as predict uses it, nothing else running).
    * ``predict_eager`` / ``predict_graph``: predict on those decoded frames one at a time (the
      numpy frames, so no decoding), with the device synchronized after each; ``graph`` is
      ``cuda_graph="auto"`` (CUDA only), whose uint8 stage is captured once the frame size
      repeats. Medians after ``warmup`` frames; the first frames' times are listed.
    * ``video_eager`` / ``video_graph``: ``model.predict(source, stream=True)`` end to end -
      decoding in its thread, overlapped with the device - frames/s over the whole pass, with the
      number of captures and the frame at which the first replay happened.
    """
    from .data.video import open_video_sources
    from .engine.verify import input_sensitive

    dev = model.device
    model = input_sensitive(model)  # an untrained head detects nothing: give NMS a real load
    opts = {"conf": conf} if "conf" in model.task_def.predict_defaults else {}
    images = []
    t0 = time.perf_counter()
    with open_video_sources(source) as vs:
        src = vs.streams[0]
        meta = {"source": str(src.name), "codec": src.codec, "width": src.width, "height": src.height,
                "fps": src.fps, "frames_declared": src.frames}
        for step in vs.steps():
            images.append(step[0].image)
            if len(images) >= frames:
                break
    decode_s = time.perf_counter() - t0
    n = len(images)
    if n == 0:
        raise ValueError(f"bench: '{source}' gave no frame")
    arms: dict[str, Any] = {"decode": {"frames": n, "ms_per_frame": decode_s * 1e3 / n, "fps": n / decode_s}}
    modes = [("eager", False)]
    graph_ok = dev.type == "cuda" and model.SUPPORTS_CUDA_GRAPH
    if graph_ok:
        modes.append(("graph", "auto"))
    for name, mode in modes:
        model.release_graphs()
        model._predictor = None  # a fresh predictor: the first frames pay what a new stream pays
        times = []
        for im in images:
            t = time.perf_counter()
            model.predict(im, imgsz=imgsz, cuda_graph=mode, **opts)
            _sync(dev)
            times.append((time.perf_counter() - t) * 1e3)
        steady = times[min(warmup, n - 1):]
        med = statistics.median(steady)
        arms[f"predict_{name}"] = {"median_ms": med, "fps": 1e3 / med, "first_frames_ms": times[:5],
                                   "frames": n}
        model.release_graphs()
        model._predictor = None
        t = time.perf_counter()
        replay_at = None
        count = 0
        for _r in model.predict(source, imgsz=imgsz, cuda_graph=mode, stream=True, **opts):
            count += 1
            if replay_at is None and mode and model.graph_info()["replays"] > 0:
                replay_at = count
            if count >= n:
                break
        _sync(dev)
        wall = time.perf_counter() - t
        info = model.graph_info()
        arms[f"video_{name}"] = {"frames": count, "fps": count / wall, "captures": info["captures"],
                                 "first_replay_at_frame": replay_at}
    model.release_graphs()
    result = {
        "model": f"{model.FAMILY}-{model.size}", "task": model.TASK, "trained": model.trained, "imgsz": imgsz,
        "video": meta, "device": device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
        "date": _dt.date.today().isoformat(), "warmup": warmup, "arms": arms,
        "graph": "measured" if graph_ok else ("needs a CUDA device" if dev.type != "cuda"
                                              else f"{model.FAMILY} is not graph-capturable"),
    }
    pe, pg = arms["predict_eager"]["median_ms"], arms.get("predict_graph", {}).get("median_ms")
    result["ratios"] = {"predict_speedup": pe / pg if pg else None,
                        "video_speedup": (arms["video_graph"]["fps"] / arms["video_eager"]["fps"]
                                          if "video_graph" in arms else None)}
    return result
