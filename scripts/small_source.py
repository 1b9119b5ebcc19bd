"""End-to-end predict (uint8 image in, Results out) of a classifier at batch 1 on sources of a few
sizes, eager and with the graph, medians: how much of the time is the frame's upload.

    PYTHONPATH=. python3 scripts/small_source.py --model resnet 18 --imgsz 224
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.benchmark import time_call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs=2, default=["resnet", "18"])
    ap.add_argument("--imgsz", type=int, default=224)
    ap.add_argument("--sizes", nargs="*", default=["256x256", "640x480", "1280x720"])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    m = LibreYOLO.new(*a.model, device="cuda", seed=0)
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    out = {"model": "-".join(a.model), "imgsz": a.imgsz, "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "arms": {}}
    for size in a.sizes:
        w, h = map(int, size.split("x"))
        img = np.asarray(pil.resize((w, h)))
        for graph in (False, True):
            t = time_call(lambda: m(img, imgsz=a.imgsz, cuda_graph=graph), torch.device("cuda"), a.runs, a.warmup)
            out["arms"][f"{size} {'graph' if graph else 'eager'}"] = t["median_ms"]
            print(f"{size} {'graph' if graph else 'eager'}: {t['median_ms']:.3f} ms", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
