"""How a thread pickling a training checkpoint slows the Python thread beside it (the step loop's
position while the trainer's writer thread runs ``torch.save``), per thread switch interval.

    PYTHONPATH=. python3 scripts/gil_probe.py [--ops 2000]

Builds yolo9-t's training checkpoint shape (weights, EMA weights, momentum: ~3,350 tensors),
times one ``torch.save`` of it alone, a tiny in-place operator call alone, and the same call
repeated while a thread runs that ``torch.save``, under several ``sys.setswitchinterval`` values.
"""
import argparse
import io
import sys
import threading
import time

import torch

from libreyolo import LibreYOLO


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=2000)
    a = ap.parse_args()
    m = LibreYOLO("yolo9t")
    sd = {"model": m.model.state_dict(), "ema": {k: v.clone() for k, v in m.model.state_dict().items()},
          "opt": {i: p.detach().clone() for i, p in enumerate(m.model.parameters())}}
    print("tensors", sum(len(v) for v in sd.values()))
    t0 = time.perf_counter()
    torch.save(sd, io.BytesIO())
    print(f"torch.save alone {time.perf_counter() - t0:.3f} s")
    x = torch.zeros(4)

    def ops(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        return (time.perf_counter() - t0) / n * 1e6
    print(f"an operator call alone {ops(300):.1f} us")
    default = sys.getswitchinterval()
    for interval in (0.005, 0.002, 0.001, 0.0005, 0.0002):
        sys.setswitchinterval(interval)
        done = []

        def writer() -> None:
            t0 = time.perf_counter()
            torch.save(sd, io.BytesIO())
            done.append(time.perf_counter() - t0)
        th = threading.Thread(target=writer)
        th.start()
        time.sleep(0.001)
        us = ops(a.ops)
        th.join()
        print(f"switch interval {interval * 1e3:.1f} ms: the call beside the writer {us:.0f} us, "
              f"the write {done[0]:.3f} s")
    sys.setswitchinterval(default)


if __name__ == "__main__":
    main()
