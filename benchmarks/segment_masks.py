"""Instance masks at the original image's size, timed side by side in one process: ``instance_masks``'
ways - each box's window (the CPU's), the whole image per chunk as tensor ops, the fused Triton
kernel (CUDA's) over every pixel and over each box's window - which give the same bits, and the
sampling they replaced (``grid_sample`` over the whole image, thresholded and cut to the box),
with how many mask pixels it gives differently.

    PYTHONPATH=. python3 benchmarks/segment_masks.py [--device cuda] [--instances 60] [--h 720 --w 1280]

Synthetic prototypes (32 x 160 x 160 at a 640 canvas, as RTMDet-Ins / YOLO-style heads have) and
boxes of 3-30 % of the image's sides, seeded; prints medians (ms) as JSON.
"""
from __future__ import annotations

import argparse
import json

import torch

from libreyolo.benchmark import time_call
from libreyolo.ops import mask_sample
from libreyolo.ops.letterbox import inverse_params
from libreyolo.tasks.segment.task import MASK_CHUNK, grid_sample_masks, instance_masks


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
    sx, sy, px, py = inverse_params(a.h, a.w, 640, "center")

    def grid_sample_before():
        chunks = [head.mask_logits(protos, coeffs[s:s + MASK_CHUNK]) for s in range(0, a.instances, MASK_CHUNK)]
        return grid_sample_masks(chunks, boxes, 640, a.h, a.w, (sx, sy, px, py))

    arms = {"windows": lambda: instance_masks(head, protos, coeffs, boxes, *args, host_boxes=host, windows=True),
            "whole_image_tensor_ops": lambda: instance_masks(head, protos, coeffs, boxes, *args, windows=False)}
    if mask_sample.available(dev):
        def fused_kernel(windowed: bool = False):   # instance_masks' CUDA way with the kernel switched on
            was = mask_sample.FUSED_ON_CUDA, mask_sample.WINDOWS_ON_CUDA
            mask_sample.FUSED_ON_CUDA, mask_sample.WINDOWS_ON_CUDA = True, windowed
            try:
                return instance_masks(head, protos, coeffs, boxes, *args, host_boxes=host)
            finally:
                mask_sample.FUSED_ON_CUDA, mask_sample.WINDOWS_ON_CUDA = was
        arms["fused_kernel"] = fused_kernel
        arms["fused_kernel_windowed"] = lambda: fused_kernel(True)   # only each box's window, after a zero fill
    arms["grid_sample_before"] = grid_sample_before
    outs = {k: f() for k, f in arms.items()}
    ref = outs["windows"]
    row = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "threads": torch.get_num_threads(), "instances": a.instances, "image": [a.h, a.w],
           "same_bits": {k: torch.equal(v, ref) for k, v in outs.items() if k != "grid_sample_before"},
           "pixels_differing_from_grid_sample": int((outs["grid_sample_before"] != ref).sum()),
           "mask_pixels": int(ref.sum())}
    for k, f in arms.items():
        row[f"{k}_ms"] = time_call(f, dev, a.runs, a.warmup)["median_ms"]
    print(json.dumps(row))


if __name__ == "__main__":
    main()
