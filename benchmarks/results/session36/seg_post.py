"""Session 36 (session 35's script with the windowed kernel): where RTMDet-Ins's graphed predict
spends its post-processing (GPU only).

    PYTHONPATH=. python3 benchmarks/results/session36/seg_post.py [--model keep/rtmdet-t-segment.pt]

1. The fused mask kernel alone (synthetic logits as benchmarks/segment_masks.py: 138 instances,
   720p) over tile shapes and warp counts: CUDA-event medians, and whether each tile gives the
   default tile's bits (it must: every pixel is the same formula).
   The windowed launch (``masks_triton(..., windows=...)``: one zero fill, then only each box's
   window) with the default tile: its bits against the whole-image launch, its kernel time.
2. instance_masks' pieces on the same inputs: the mask logits, the two axis tables, the output
   allocation, the kernel launch whole-image and windowed (host wall, synchronized).
3. With a model: the graphed predict's wall (median of 100 calls) with the windows off and on,
   the masks compared; torch.profiler over 10 graphed predict calls on the 720p sample (windows
   off, then on), operators by host time and by device time.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

from libreyolo.benchmark import event_time_call, time_call
from libreyolo.ops import mask_sample
from libreyolo.ops.letterbox import inverse_params


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--instances", type=int, default=138)
    a = ap.parse_args()
    dev = torch.device("cuda")
    h, w, n = 720, 1280, a.instances
    g = torch.Generator().manual_seed(0)
    protos = torch.randn(32, 160, 160, generator=g).to(dev)
    coeffs = torch.randn(n, 32, generator=g).to(dev)
    side = torch.tensor([w, h], dtype=torch.float32)
    wh = (0.03 + 0.27 * torch.rand(n, 2, generator=g)) * side
    xy = torch.rand(n, 2, generator=g) * (side - wh)
    boxes = torch.cat((xy, xy + wh), 1).to(dev)
    sx, sy, px, py = inverse_params(h, w, 640, "center")
    logits = torch.einsum("nc,chw->nhw", coeffs, protos).contiguous()
    xt = mask_sample.axis_table(w, sx, px, 640, 160, dev)
    yt = mask_sample.axis_table(h, sy, py, 640, 160, dev)
    ref = mask_sample.masks_triton(logits, xt, yt, boxes, 0.0)
    row: dict = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "instances": n,
                 "image": [h, w], "default_tile": [mask_sample.BLOCK_H, mask_sample.BLOCK_W],
                 "inside_fraction": float(ref.float().mean()), "tiles": []}
    out = torch.empty_like(ref)
    for bh, bw in [(16, 64), (8, 128), (16, 128), (32, 128), (8, 256), (16, 256), (32, 64), (4, 512)]:
        for nw in (4, 8):
            grid = (n, triton.cdiv(h, bh), triton.cdiv(w, bw))

            def run(bh=bh, bw=bw, nw=nw, grid=grid):
                mask_sample._masks_kernel[grid](logits, *xt, *yt, boxes, boxes, out.view(torch.int8), 0.0, h, w, 160,
                                                160, BLOCK_H=bh, BLOCK_W=bw, WINDOWED=False, num_warps=nw,
                                                enable_fp_fusion=False)
            out.fill_(True)
            run()
            row["tiles"].append({"tile": [bh, bw], "warps": nw, "same_bits": bool(torch.equal(out, ref)),
                                 "kernel_ms": event_time_call(run, 50, 5)["median_ms"]})
    from libreyolo.tasks.segment.task import box_windows
    win = box_windows(boxes.cpu().numpy(), h, w)
    windowed = mask_sample.masks_triton(logits, xt, yt, boxes, 0.0, windows=win)
    row["windowed_same_bits"] = bool(torch.equal(windowed, ref))
    row["windowed_launch_ms"] = event_time_call(
        lambda: mask_sample.masks_triton(logits, xt, yt, boxes, 0.0, windows=win), 50, 5)["median_ms"]
    # a plain write of the same bytes: the floor for any kernel producing these masks
    row["zero_fill_ms"] = event_time_call(lambda: out.zero_(), 50, 5)["median_ms"]
    pieces = {
        "mask_logits_einsum": lambda: torch.einsum("nc,chw->nhw", coeffs, protos),
        "axis_tables": lambda: (mask_sample.axis_table(w, sx, px, 640, 160, dev),
                                mask_sample.axis_table(h, sy, py, 640, 160, dev)),
        "alloc": lambda: torch.empty((n, h, w), dtype=torch.bool, device=dev),
        "masks_triton": lambda: mask_sample.masks_triton(logits, xt, yt, boxes, 0.0),
        "box_windows_host": lambda: box_windows(boxes.cpu().numpy(), h, w),
        "masks_triton_windowed": lambda: mask_sample.masks_triton(logits, xt, yt, boxes, 0.0, windows=win),
    }
    row["pieces_wall_ms"] = {k: time_call(f, dev, 50, 5)["median_ms"] for k, f in pieces.items()}
    print(json.dumps(row), flush=True)
    if a.model:
        from torch.profiler import ProfilerActivity, profile

        from libreyolo import SAMPLE_IMAGE, LibreYOLO
        model = LibreYOLO(a.model, device="cuda")
        import statistics
        import time
        masks = {}
        for on in (False, True):
            mask_sample.WINDOWS_ON_CUDA = on
            for _ in range(5):
                r = model(SAMPLE_IMAGE, cuda_graph=True)
            torch.cuda.synchronize()
            walls = []
            for _ in range(100):
                t0 = time.perf_counter()
                r = model(SAMPLE_IMAGE, cuda_graph=True)
                walls.append((time.perf_counter() - t0) * 1e3)
            masks[on] = r[0].masks.data.clone()
            print(json.dumps({"windows": on, "instances": len(r[0]), "predict_wall_median_ms":
                              round(statistics.median(walls), 3)}), flush=True)
        print(json.dumps({"predict_masks_equal_windows_on_off": bool(torch.equal(masks[False], masks[True]))}),
              flush=True)
        for on in (False, True):
            mask_sample.WINDOWS_ON_CUDA = on
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    model(SAMPLE_IMAGE, cuda_graph=True)
                torch.cuda.synchronize()
            ka = prof.key_averages()
            print(f"== profile, windows {on}", flush=True)
            print(ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
            print(ka.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
