"""Session 35's post-processing profile of RTMDet-Ins's graphed predict (GPU only), superseded by
``benchmarks/results/session36/seg_post.py``: the mask kernel's signature changed (its windowed
launch), so this name runs that script, which does everything this one did and times the
windowed launch beside it.

    PYTHONPATH=. python3 benchmarks/results/session35/seg_post.py [--model keep/rtmdet-t-segment.pt]
"""
import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).parents[1] / "session36" / "seg_post.py"), run_name="__main__")
