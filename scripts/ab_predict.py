"""Graphed predict of this tree against an earlier one, side by side in one process (GPU only).

    git archive <rev> libreyolo | tar -x -C /tmp/ab && mv /tmp/ab/libreyolo /tmp/ab/libreyolo_base
    PYTHONPATH=.:/tmp/ab python3 scripts/ab_predict.py --baseline libreyolo_base yolo7:tiny yolox:n --out ab.json

With several baselines (``--baseline a,b``) every tree is an arm of the same alternation.

The package imports itself relatively, so a copy under another name loads beside it. For each
family:size both trees build the same seeded, input-sensitive model (as ``libreyolo bench``
does), predict the 1280x720 sample at ``--imgsz`` (640) with ``cuda_graph=True``, and are timed in
alternating blocks (``--rounds`` x ``--n`` calls each, wall time with a synchronize after each
call, median of the block medians). Also: the boxes of both trees must be equal, and the
network's graphed forward (the ratio's denominator) is timed in the same process.
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time

import torch

import libreyolo
from libreyolo.benchmark import time_call
from libreyolo.data.sources import load_sources
from libreyolo.graphs.capture import CudaGraphCapturer


def build(pkg, spec: str):
    fam, size = spec.split(":")
    verify = importlib.import_module(f"{pkg.__name__}.engine.verify")
    return verify.input_sensitive(pkg.LibreYOLO.new(fam, size, device="cuda", seed=0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--baseline", required=True,
                    help="importable name of the earlier tree's package copy (several: comma-separated)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--imgsz", type=int, default=640, help="predict and forward size (as libreyolo bench)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=100)
    a = ap.parse_args()
    bases = [importlib.import_module(name) for name in a.baseline.split(",")]
    dev = torch.device("cuda")
    img = load_sources(libreyolo.SAMPLE_IMAGE)[0].image
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "baselines": a.baseline.split(","), "models": {}}
    for spec in a.specs:
        new = build(libreyolo, spec)
        olds = {b.__name__: build(b, spec) for b in bases}
        same_weights = all(torch.equal(x, y) for old in olds.values()
                           for x, y in zip(new.model.state_dict().values(), old.model.state_dict().values()))
        arms = {"this_tree": lambda: new(img, imgsz=a.imgsz, cuda_graph=True)}
        arms.update({name: (lambda o=old: o(img, imgsz=a.imgsz, cuda_graph=True)) for name, old in olds.items()})
        for fn in arms.values():
            fn()
            fn()
        ref = arms["this_tree"]()
        equal = all(torch.equal(torch.as_tensor(x.boxes.data), torch.as_tensor(y.boxes.data))
                    for name, fn in arms.items() for x, y in zip(ref, fn()))
        times: dict = {k: [] for k in arms}
        for _ in range(a.rounds):
            for k, fn in arms.items():
                times[k].append(time_call(fn, dev, a.n, 10)["median_ms"])
        x = torch.rand((1, 3, a.imgsz, a.imgsz), generator=torch.Generator().manual_seed(0)).to(dev)
        net = new.model.eval()
        with torch.no_grad():
            g = CudaGraphCapturer().capture(lambda t: net(t), (x,), module=net)
            fwd = time_call(lambda: g.replay((x,), clone=False), dev, 300, 30)["median_ms"]
        med = {k: round(statistics.median(v), 4) for k, v in times.items()}
        entry = {"same_weights": same_weights, "boxes_equal": equal, "predict_graph_ms": med,
                 "rounds_ms": {k: [round(t, 4) for t in v] for k, v in times.items()},
                 "forward_graph_ms": round(fwd, 4),
                 "ratio_to_forward": {k: round(v / fwd, 3) for k, v in med.items()},
                 "saved_ms": {k: round(v - med["this_tree"], 4) for k, v in med.items() if k != "this_tree"}}
        report["models"][spec] = entry
        print(spec, json.dumps(entry), flush=True)
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
