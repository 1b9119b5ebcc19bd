"""How fast the built-in detection set is generated with 1, 2, ... worker processes.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/builtin_sets.py --n-train 2000 --n-val 200 \
        --imgsz 640 --workers 1 2

Each arm generates ``make_shapes_dataset(n_train, n_val, imgsz)`` into an empty temporary folder,
in a fresh process with ``LIBREYOLO_DATASET_WORKERS`` set to the arm's count, and reports the
generation's wall time (the call alone, not the interpreter's start or imports), images/s, the CPU
seconds of that process and its workers, and - on Linux, from ``/proc/stat`` - the CPU seconds the
rest of the machine used meanwhile (a shared machine's other load, which a wall-clock figure
cannot leave out). ``--repeats`` runs the arms in turn that many times. Every arm's files must be
the same bytes (their manifests, which hold every file's SHA-256, are compared); the folders are
removed afterwards. One JSON line per run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import sys, time
from libreyolo.data.synthetic import make_shapes_dataset
t = time.perf_counter()
make_shapes_dataset(sys.argv[1], n_train=int(sys.argv[2]), n_val=int(sys.argv[3]), imgsz=int(sys.argv[4]))
print(time.perf_counter() - t)
"""


def _busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy (all cores), or None off Linux."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]  # steal (a hypervisor's) left out
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _run(workers: int, args, root: Path) -> dict:
    env = dict(os.environ, LIBREYOLO_DATASET_WORKERS=str(workers))
    before, busy0 = resource.getrusage(resource.RUSAGE_CHILDREN), _busy_seconds()
    out = subprocess.run([sys.executable, "-c", _CHILD, str(root), str(args.n_train), str(args.n_val),
                          str(args.imgsz)], env=env, check=True, capture_output=True, text=True)
    after, busy1 = resource.getrusage(resource.RUSAGE_CHILDREN), _busy_seconds()
    wall = float(out.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    n = args.n_train + args.n_val
    return {"workers": workers, "images": n, "imgsz": args.imgsz, "wall_s": round(wall, 2),
            "images_per_s": round(n / wall, 1), "cpu_s": round(cpu, 1),
            "others_cpu_s": None if busy0 is None else round(busy1 - busy0 - cpu, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-val", type=int, default=200)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="builtin-sets-"))
    try:
        manifests = set()
        for rep in range(args.repeats):
            for w in args.workers:
                root = tmp / f"w{w}-r{rep}"
                print(json.dumps(_run(w, args, root)), flush=True)
                manifests.add((root / "manifest.json").read_bytes())
                shutil.rmtree(root)
        if len(manifests) != 1:
            raise SystemExit("the arms wrote different files")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
