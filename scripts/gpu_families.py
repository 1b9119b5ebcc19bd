"""Per-family GPU proof and figures, one process: parity protocol, then benchmarks.

    PYTHONPATH=. python3 scripts/gpu_families.py yolox:n yolox:s rtmdet:t --out $OUT/families.json

For each family:size (untrained, seeded): ``verify_model`` (the parity protocol of
``libreyolo verify``: fp32 and float16 autocast, batch 1 and 8, network and predict stage).
Only when every check passes is the family treated as graph-capable *in this process*
(the class attribute is set here, never in the code: flipping it in the code is a commit
that cites this run), and then ``bench_model`` measures eager / graphed forward and
end-to-end predict at batch 1, 640. ``--train`` adds the training-step benchmark arms for
families with a loss.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import traceback

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+", help="family:size")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--train", action="store_true")
    a = ap.parse_args()
    from libreyolo.benchmark import bench_model
    from libreyolo.engine.verify import verify_model
    from libreyolo.models.registry import get_family

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "models": {}}
    for spec in a.specs:
        fam, size = spec.split(":")
        cls = get_family(fam)
        entry: dict = {}
        report["models"][spec] = entry
        try:
            model = cls.new(size, device="cuda", seed=0)
            results = verify_model(model, imgsz=640, batches=(1, 8))
            entry["parity"] = [r.as_dict() for r in results]
            entry["parity_pass"] = all(r.passed for r in results)
            print(f"{spec}: parity {'PASS' if entry['parity_pass'] else 'FAIL'}", flush=True)
            if entry["parity_pass"]:
                cls.SUPPORTS_CUDA_GRAPH = True
                model = cls.new(size, device="cuda", seed=0)
                b = bench_model(model, imgsz=640, batch=1, runs=a.runs, warmup=30)
                entry["bench"] = {k: b[k] for k in ("arms", "ratios", "detections_per_image", "date")}
                r = b["arms"]
                print(f"{spec}: forward eager {r['forward_eager']['median_ms']:.3f} graph "
                      f"{r['forward_graph']['median_ms']:.3f} | predict eager {r['predict_eager']['median_ms']:.3f} "
                      f"graph {r['predict_graph']['median_ms']:.3f} ms", flush=True)
        except Exception as exc:  # one family's failure must not hide the others' results
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-2000:]
            print(f"{spec}: ERROR {entry['error']}", flush=True)
        if a.train:
            try:
                proc = subprocess.run([sys.executable, "benchmarks/train_step.py", "--all", "--model", f"{fam}{size}",
                                       "--batch", "8", "--imgsz", "640", "--amp", "--runs", "30", "--warmup", "5"],
                                      capture_output=True, text=True, timeout=100)
                entry["train_step"] = json.loads(proc.stdout[proc.stdout.index("{"):]) if proc.returncode == 0 \
                    else {"error": proc.stderr[-1500:]}
                ts = entry["train_step"]
                print(f"{spec}: train step b8 640 bf16 " + ", ".join(
                    f"{k} {v.get('median_ms', float('nan')):.1f} ms" for k, v in ts.get("arms", {}).items())
                    + f" | {ts.get('error', '')[-300:]}", flush=True)
            except Exception as exc:
                entry["train_step"] = {"error": f"{type(exc).__name__}: {exc}"}
        with open(a.out, "w") as f:
            json.dump(report, f, indent=2, default=str)


if __name__ == "__main__":
    main()
