"""Which way of loading an AOTInductor package works on this machine (GPU diagnosis for fast="aot").

Builds two packages on the device - a toy conv network compiled by torch's own
``aoti_compile_and_package`` to a plain path, and yolox-n's fp16 fast-path network through
``fastpath.AotInfer`` (the library's build: temporary file, then rename) - then loads and runs each
in fresh processes, one loader per process (a segmentation fault ends only that child):

  direct-st   torch._C._aoti.AOTIModelPackageLoader(path, "model", True, 1, idx) (AotPackage's way)
  direct-mt   the same with run_single_threaded=False
  public-st   torch._inductor.aoti_load_package(path, run_single_threaded=True, device_index=idx)
  public-mt   the same with run_single_threaded=False

and prints one JSON line per (package, loader): the child's exit code, whether its output equals
the network run eagerly in the same child (bitwise and max |diff|) and, for the single-threaded
loaders, whether a CUDA graph of the package's call replays bitwise.

    PYTHONPATH=. python scripts/aot_load_probe.py [--imgsz 320]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LOADERS = ("direct-st", "direct-mt", "public-st", "public-mt")


def _toy():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.SiLU(),
                               torch.nn.Conv2d(16, 8, 3, padding=1)).cuda().half().eval()


def build(cache: Path, imgsz: int) -> dict:
    import torch
    from torch import _inductor as inductor

    from libreyolo import LibreYOLO
    from libreyolo.engine import fastpath
    out = {}
    x = torch.randn(1, 3, 64, 64, device="cuda", dtype=torch.half)
    with torch.no_grad():
        ep = torch.export.export(_toy(), (x,))
    out["toy"] = inductor.aoti_compile_and_package(ep, package_path=str(cache / "toy.pt2"))
    m = LibreYOLO.new("yolox", "n", device="cuda", seed=0)
    hn = fastpath.half_network(m, "fp16", fast="aot", verify=False)
    xi = torch.rand(1, 3, imgsz, imgsz, device="cuda").half().contiguous(memory_format=torch.channels_last)
    try:
        hn(xi)   # builds, then loads through AotPackage: may crash this process
    except Exception as exc:   # noqa: BLE001
        print("build-load:", type(exc).__name__, exc, file=sys.stderr)
    out["yoloxn"] = [str(p) for p in sorted(fastpath.aot_cache_dir().glob("yolox-n-*.pt2"))][-1]
    return out


def child(pkg: str, which: str, loader: str, imgsz: int) -> dict:
    import faulthandler
    faulthandler.enable()
    import torch
    res: dict = {"package": which, "loader": loader}
    if which == "toy":
        x = torch.randn(1, 3, 64, 64, device="cuda", dtype=torch.half)
        ref = _toy()(x)
    else:
        from libreyolo import LibreYOLO
        from libreyolo.engine import fastpath
        m = LibreYOLO.new("yolox", "n", device="cuda", seed=0)
        hn = fastpath.half_network(m, "fp16", fast=False, verify=False)
        x = torch.rand(1, 3, imgsz, imgsz, device="cuda").half().contiguous(memory_format=torch.channels_last)
        ref = hn(x)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    st = loader.endswith("-st")
    if loader.startswith("direct"):
        ld = torch._C._aoti.AOTIModelPackageLoader(pkg, "model", st, 1, 0)
        from torch.utils import _pytree as pytree
        spec = pytree.treespec_loads(ld.get_call_spec()[1])

        def run(t):
            return pytree.tree_unflatten(ld.boxed_run([t]), spec)
    else:
        from torch import _inductor as inductor
        run = inductor.aoti_load_package(pkg, run_single_threaded=st, device_index=0)
    res["loaded"] = True
    got = run(x)
    got = got if isinstance(got, (tuple, list)) else (got,)
    torch.cuda.synchronize()
    res["outputs"] = len(got)
    res["max_abs_diff_vs_eager"] = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, ref))
    res["direct_equals_eager"] = all(torch.equal(a, b) for a, b in zip(got, ref))
    if st:
        try:
            xs = x.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    run(xs)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                gout = run(xs)
            gout = gout if isinstance(gout, (tuple, list)) else (gout,)
            g.replay()
            torch.cuda.synchronize()
            res["graph_equals_direct"] = all(torch.equal(a, b) for a, b in zip(gout, got))
        except Exception as exc:   # noqa: BLE001
            res["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return res


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--child", nargs=3, metavar=("PACKAGE", "WHICH", "LOADER"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.imgsz)), flush=True)
        return 0
    cache = Path(os.environ.setdefault("LIBREYOLO_CACHE_DIR", tempfile.mkdtemp(prefix="aotprobe-")))
    cache.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-c", "import json, sys; sys.path.insert(0, 'scripts'); "
                        f"import aot_load_probe as a; from pathlib import Path; "
                        f"print('PKGS', json.dumps(a.build(Path({str(cache)!r}), {args.imgsz})))"],
                       capture_output=True, text=True)
    print(json.dumps({"build_rc": p.returncode, "stderr_tail": p.stderr[-1500:]}), flush=True)
    pkgs = {}
    for line in p.stdout.splitlines():
        if line.startswith("PKGS "):
            pkgs = json.loads(line[5:])
    if not pkgs:   # the build process crashed loading its own package: find what it wrote
        toy = cache / "toy.pt2"
        found = sorted((cache / "aot").rglob("yolox-n-*.pt2"))
        pkgs = {**({"toy": str(toy)} if toy.is_file() else {}), **({"yoloxn": str(found[-1])} if found else {})}
    for which, pkg in pkgs.items():
        for loader in LOADERS:
            c = subprocess.run([sys.executable, __file__, "--imgsz", str(args.imgsz), "--child", pkg, which, loader],
                               capture_output=True, text=True, timeout=300)
            line = next((ln for ln in c.stdout.splitlines() if ln.startswith("{")), None)
            rec = json.loads(line) if line else {"package": which, "loader": loader}
            rec["rc"] = c.returncode
            if c.returncode:
                rec["stderr_tail"] = c.stderr[-600:]
            print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
