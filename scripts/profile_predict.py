"""Where does end-to-end predict time go? torch.profiler over graphed predict calls.

    PYTHONPATH=. python3 scripts/profile_predict.py [model] [imgsz] [out_dir]

Prints the top ops by device time and by host time and writes the tables (and a Chrome
trace) to out_dir. Untrained models get the seeded re-draw used by bench, so NMS has work.
"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.data.sources import load_sources
from libreyolo.engine.verify import input_sensitive


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "yolo9t"
    imgsz = int(sys.argv[2]) if len(sys.argv) > 2 else 640
    out = Path(sys.argv[3] if len(sys.argv) > 3 else "runs/profile")
    out.mkdir(parents=True, exist_ok=True)
    model = input_sensitive(LibreYOLO(name))
    img = load_sources(SAMPLE_IMAGE)[0].image
    for _ in range(30):
        model.predict(img, imgsz=imgsz, cuda_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            model.predict(img, imgsz=imgsz, cuda_graph=True)
        torch.cuda.synchronize()
    ka = prof.key_averages()
    dev = ka.table(sort_by="cuda_time_total", row_limit=25)
    host = ka.table(sort_by="self_cpu_time_total", row_limit=30)
    (out / "device_ops.txt").write_text(dev)
    (out / "host_ops.txt").write_text(host)
    prof.export_chrome_trace(str(out / "trace.json"))
    print(dev)
    print(host)


if __name__ == "__main__":
    main()
