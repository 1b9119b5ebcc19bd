"""``libreyolo demo`` under different CPU thread counts: wall and CPU time of the whole command.

Each arm is a fresh process (``python -m libreyolo.cli demo ...``) with ``LIBREYOLO_THREADS`` set
to the arm's count, or unset for ``auto`` (the count :mod:`libreyolo.threads` chooses);
``OMP_NUM_THREADS`` is removed so that the library's choice applies. The arms run in turn,
``--repeats`` times each (interleaved), after one untimed run that generates the demo's dataset.
Recorded per run: the wall time, the CPU time (user + system) of the process, the one-minute load
average just before, and the library's "CPU threads:" log line. Compare arms of one invocation
only: the machine's other load moves every figure.

    PYTHONPATH=. python benchmarks/threads_demo.py --arms 1 2 auto --epochs 1 --json threads.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_demo(arm: str, epochs: int, imgsz: int | None, project: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.pop("LIBREYOLO_THREADS", None)
    if arm != "auto":
        env["LIBREYOLO_THREADS"] = arm
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "libreyolo.cli", "demo", f"epochs={epochs}", "device=cpu", f"project={project}"]
    if imgsz:
        cmd.append(f"imgsz={imgsz}")
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"demo failed ({arm}): {proc.stderr[-2000:]}")
    threads_line = next((ln for ln in (proc.stdout + proc.stderr).splitlines() if "CPU threads:" in ln), "")
    return {"arm": arm, "wall_s": round(wall, 2),
            "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2),
            "load_before": round(load, 2), "threads_line": threads_line.strip()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=["1", "2", "auto"], help="thread counts, or auto")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--imgsz", type=int, default=None, help="the demo's imgsz (default: the demo's)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the runs here")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="threads-demo-") as tmp:
        run_demo("1", 1, args.imgsz, Path(tmp) / "warm")   # the dataset generated once, untimed
        for r in range(args.repeats):
            for arm in args.arms:
                res = run_demo(arm, args.epochs, args.imgsz, Path(tmp) / f"{arm}-{r}")
                runs.append(res)
                print(json.dumps(res), flush=True)
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.processor() or platform.platform()}",
           "runs": runs}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
