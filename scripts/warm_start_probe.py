"""Where a process's time to its first fast-path result goes, phase by phase (issue 15's warm start).

Each measurement is a fresh Python process (``--child``), so the import, the dynamo trace and
inductor's caches are those of a new process: the first process of a cache directory compiles
(cold), every later one reads what it wrote (warm). The driver runs ``--cold`` cold processes and
``--warm`` warm ones over one cache directory and prints one JSON line per process:

  import_torch_s, import_libreyolo_s, build_s (the model), half_s (the half copy and the
  torch.compile wrapper), first_call_s (dynamo + AOTAutograd + inductor or their cache hits +
  the first run), second_call_s, first_result_s (interpreter start to the first output), the
  dynamo_timed phases inside the first call (``phases``: dynamo's own per-phase seconds, e.g.
  ``entire_frame_compile``, ``backend_compile``, ``inductor_compile``, ``fx_codegen_and_compile``),
  inductor's cache counters (fxgraph_cache_hit/miss, aotautograd hit/miss, async compile), the
  compile pool's size and whether the output is bitwise equal to the previous process's.

The network is the fast path's own: ``fastpath.half_network(model, precision, fast=True)`` (fuse,
half, channels_last, ``compile_infer``) called on a random half NHWC input; on the CPU that is
inductor's C++ backend (``fast=True`` itself is refused there: this is a diagnosis, not a
feature). ``--arm aoti`` instead runs ``fast="aot"``: the AOTInductor package of the same network
(``fastpath.AotInfer``: torch.export + ``aoti_compile_and_package`` into ``<cache>/aot/``, loaded
by ``fastpath.AotPackage``, torch's C++ package loader), built by the cold process and loaded by
the warm ones: no dynamo and no inductor in a warm process. The package holds the weights (seed 0
here in every process, so the warm ones find it).

  PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/warm_start_probe.py --model yoloxn --imgsz 640 \
      --precision bf16 --cold 1 --warm 2 [--device cuda] [--arm compile|aoti]
"""
from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402


def _tensors(out) -> list:
    flat = out if isinstance(out, (tuple, list)) else [out]
    return [o for o in flat if hasattr(o, "data_ptr")]


def child(args) -> dict:
    t = {}
    import torch
    t["import_torch_s"] = time.perf_counter() - T0
    t1 = time.perf_counter()
    from libreyolo import LibreYOLO
    from libreyolo.engine import fastpath
    t["import_libreyolo_s"] = time.perf_counter() - t1
    dev = torch.device(args.device)
    t1 = time.perf_counter()
    fam, size = args.family, args.size
    model = LibreYOLO.new(fam, size, device=str(dev), seed=0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t["build_s"] = time.perf_counter() - t1
    g = torch.Generator().manual_seed(0)
    dtype = fastpath.DTYPES[args.precision]
    x = torch.rand(1, 3, args.imgsz, args.imgsz, generator=g).to(dev, dtype).contiguous(
        memory_format=torch.channels_last)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        t1 = time.perf_counter()
        fn = fastpath.half_network(model, args.precision, fast="aot" if args.arm == "aoti" else True)
        t["half_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        out = fn(x)
        sync()
        t["first_call_s"] = time.perf_counter() - t1
        t["first_result_s"] = time.perf_counter() - T0
        dynamo_before = "torch._dynamo" in sys.modules
        t1 = time.perf_counter()
        fn(x)
        sync()
        t["second_call_s"] = time.perf_counter() - t1
        if dev.type == "cuda":
            # the predictor's capture: the compiled (or AOTInductor) kernels inside our own graph,
            # its replay bitwise equal to the same network called directly
            from libreyolo.graphs.capture import CudaGraphCapturer
            t1 = time.perf_counter()
            try:
                graph = CudaGraphCapturer().capture(lambda t: fn(t), (x,))
                got = graph.replay((x,))
                sync()
                t["capture_s"] = time.perf_counter() - t1
                ref_out = fn(x)
                t["graph_bitwise_equal_direct"] = all(
                    torch.equal(a, b) for a, b in zip(_tensors(got), _tensors(ref_out)))
            except Exception as exc:   # noqa: BLE001 - the figure is whether it captures
                t["capture_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    t["dynamo_imported_by_first_result"] = dynamo_before
    # imported after the first result: the aot arm itself needs no dynamo, and its import is ~1 s
    from torch._dynamo.utils import compilation_time_metrics, counters
    t["phases"] = {k: round(sum(v), 3) for k, v in compilation_time_metrics.items()}
    t["counters"] = {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd")}
    import torch._inductor.config as icfg
    t["compile_threads"] = icfg.compile_threads
    t["cache_dir"] = str(getattr(fn, "cache_dir", None))
    t["first_call_cache"] = getattr(fn, "first_call_cache", None)
    t["env"] = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    ref = Path(args.cache) / f"probe-out-{args.arm}-{fam}-{size}-{args.precision}-{args.imgsz}-{dev.type}.pt"
    now = [o.detach().cpu() for o in _tensors(out)]
    if ref.exists():
        prev = torch.load(ref, weights_only=True)
        t["bitwise_equal_previous"] = len(prev) == len(now) and all(torch.equal(a, b) for a, b in zip(prev, now))
    else:
        torch.save(now, ref)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="yoloxn")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--arm", default="compile", choices=("compile", "aoti"))
    ap.add_argument("--cache", default=None, help="LIBREYOLO_CACHE_DIR (default: a fresh temp dir)")
    ap.add_argument("--cold", type=int, default=1)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--family"), ap.add_argument("--size")
    args = ap.parse_args()
    if args.child:
        print("PROBE " + json.dumps(child(args)), flush=True)
        os._exit(0)   # no teardown: the figure is the time to the first result
    from libreyolo.models.registry import parse_spec
    spec = parse_spec(args.model)
    if spec is None:
        raise SystemExit(f"unknown model {args.model!r} (e.g. yoloxn, yolo9t)")
    fam, size = spec[0].FAMILY, spec[1]
    cache = args.cache or tempfile.mkdtemp(prefix="libreyolo-warm-")
    # the fresh directory alone: an inherited TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR would win
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env["LIBREYOLO_CACHE_DIR"] = cache
    base = [sys.executable, __file__, "--child", "--family", fam, "--size", size, "--imgsz", str(args.imgsz),
            "--precision", args.precision, "--device", args.device, "--arm", args.arm, "--cache", cache]
    for kind, n in (("cold", args.cold), ("warm", args.warm)):
        for _i in range(n):
            t0 = time.perf_counter()
            p = subprocess.run(base, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")]
            if p.returncode or not line:
                print(json.dumps({"kind": kind, "error": (p.stderr or p.stdout)[-2000:]}), flush=True)
                continue
            res = json.loads(line[-1][6:])
            res.update(kind=kind, model=args.model, imgsz=args.imgsz, precision=args.precision,
                       device=args.device, arm=args.arm, process_wall_s=round(wall, 3))
            print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
