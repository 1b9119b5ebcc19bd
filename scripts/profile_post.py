"""Where predict's post-processing time goes (GPU): yolo9-t, SAMPLE_IMAGE, 640, graph mode.

    PYTHONPATH=. python3 scripts/profile_post.py

Times, each a median over 300 calls with the device synchronized before and after: the
predict stage replay, the host and the device NMS paths, their pieces, and the full call.
"""
from __future__ import annotations

import json
import statistics
import time

import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.data.sources import load_sources
from libreyolo.engine.verify import input_sensitive
from libreyolo.ops.nms import nms_per_image


def med(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(out), 4)


def main() -> None:
    m = input_sensitive(LibreYOLO.new("yolo9", "t", device="cuda", seed=0))
    img = load_sources(SAMPLE_IMAGE)[0].image
    p = m._get_predictor()
    dev = [p._upload(img)]
    res = {}
    p.run_batch(dev, 640, True, None)
    (b, s, c), _ = p.run_batch(dev, 640, True, None)
    res["passing_conf_0.25"] = int((s > 0.25).sum())
    res["stage_replay_ms"] = med(lambda: p.run_batch(dev, 640, True, None))
    res["nms_host_ms"] = med(lambda: nms_per_image(b, s, c, conf=0.25, iou=0.45))
    res["nms_device_ms"] = med(lambda: nms_per_image(b, s, c, conf=0.25, iou=0.45, host_limit=0))
    res["pack_to_host_ms"] = med(lambda: torch.cat((b.float(), s.float()[..., None], c.float()[..., None]), -1).cpu())
    res["upload_ms"] = med(lambda: p._upload(img))
    res["predict_graph_ms"] = med(lambda: m(img, cuda_graph=True))
    res["dets"] = len(m(img, cuda_graph=True)[0])
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
