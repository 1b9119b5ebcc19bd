"""Where a ``libreyolo train`` process spends its wall time outside the epochs (issue 16's
whole-process target): the command's arguments run through :func:`libreyolo.cli.main` under
cProfile, in this process, with the seconds of the import of libreyolo and of ``main`` printed
on one line, and the profile
written to ``--prof`` (read it with ``python -m pstats``, or ``--top N`` prints the N functions of
largest cumulative time).

    PYTHONPATH=. python3 -X importtime scripts/profile_train_cli.py --prof p.out --top 60 -- \
        train model=yolo9t data=shapes epochs=30 batch=16 imgsz=320 cuda_graph=true 2> importtime.txt
"""
import argparse
import cProfile
import pstats
import sys
import time


def main() -> None:
    started = time.perf_counter()
    ap = argparse.ArgumentParser()
    ap.add_argument("--prof", default="train_cli.prof")
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    argv = a.command[1:] if a.command[:1] == ["--"] else a.command
    import libreyolo.cli as cli
    imported = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    try:
        rc = cli.main(argv)
    finally:
        prof.disable()
        done = time.perf_counter()
        prof.dump_stats(a.prof)
    print(f"profile_train_cli: import libreyolo {imported - started:.2f} s, main {done - imported:.2f} s, "
          f"rc {rc} (the process's wall, start and exit included, is the shell's to time)", flush=True)
    if a.top:
        pstats.Stats(a.prof).sort_stats("cumulative").print_stats(a.top)


if __name__ == "__main__":
    sys.exit(main())
