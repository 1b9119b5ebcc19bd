#!/usr/bin/env python
"""Write a synthetic clip of moving shapes (libreyolo.data.clips) for `libreyolo bench source=`.

    python scripts/make_clip.py clip.mp4                      # 1920x1080, 300 frames at 30 fps
    python scripts/make_clip.py small.mp4 --width 320 --height 240 --frames 60 --truth truth.json

--truth also writes the boxes of every frame (id, class, x1, y1, x2, y2) as JSON.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libreyolo.data.clips import write_moving_shapes_clip  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the video file to write (.mp4)")
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--objects", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--truth", help="also write the per-frame boxes to this JSON file")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.perf_counter()
    truth = write_moving_shapes_clip(a.out, a.width, a.height, a.frames, a.fps, a.objects, a.seed)
    print(f"wrote {a.out}: {a.width}x{a.height}, {a.frames} frames at {a.fps:g} fps, {a.objects} shapes "
          f"({time.perf_counter() - t0:.1f} s)")
    if a.truth:
        Path(a.truth).write_text(json.dumps([t.tolist() for t in truth]))
        print(f"boxes per frame (id, class, x1, y1, x2, y2) in {a.truth}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
