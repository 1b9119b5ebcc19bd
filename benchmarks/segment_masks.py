"""Instance masks at the original image's size, ``instance_masks``' two ways: sampled in each box's
window (predict's way on the CPU) vs the whole image sampled and cut to the box (the definition;
predict's way on CUDA), the same bits, timed side by side in one process.

    PYTHONPATH=. python3 benchmarks/segment_masks.py [--device cuda] [--instances 60] [--h 720 --w 1280]

Synthetic prototypes (32 x 160 x 160 at a 640 canvas, as RTMDet-Ins / YOLO-style heads have) and
boxes of 3-30 % of the image's sides, seeded; prints medians (ms) and their ratio as JSON.
"""
from __future__ import annotations

import argparse
import json

import torch

from libreyolo.benchmark import time_call
from libreyolo.tasks.segment.task import instance_masks


class Head:
    def mask_logits(self, protos, coeffs):
        return torch.einsum("nc,chw->nhw", coeffs, protos)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--instances", type=int, default=60)
    ap.add_argument("--h", type=int, default=720)
    ap.add_argument("--w", type=int, default=1280)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device(a.device)
    g = torch.Generator().manual_seed(0)
    protos = torch.randn(32, 160, 160, generator=g).to(dev)
    coeffs = torch.randn(a.instances, 32, generator=g).to(dev)
    side = torch.tensor([a.w, a.h], dtype=torch.float32)
    wh = (0.03 + 0.27 * torch.rand(a.instances, 2, generator=g)) * side
    xy = torch.rand(a.instances, 2, generator=g) * (side - wh)
    boxes = torch.cat((xy, xy + wh), 1).to(dev)
    host = boxes.cpu().numpy()
    head, args = Head(), (640, a.h, a.w, "center")

    def windows():
        return instance_masks(head, protos, coeffs, boxes, *args, host_boxes=host, windows=True)

    def whole_image():
        return instance_masks(head, protos, coeffs, boxes, *args, windows=False)

    same = torch.equal(windows(), whole_image())
    t_win = time_call(windows, dev, a.runs, a.warmup)
    t_all = time_call(whole_image, dev, a.runs, a.warmup)
    print(json.dumps({"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "instances": a.instances,
                      "image": [a.h, a.w], "same_bits": same, "windows_ms": t_win["median_ms"],
                      "whole_image_ms": t_all["median_ms"], "ratio": t_all["median_ms"] / t_win["median_ms"]}))


if __name__ == "__main__":
    main()
