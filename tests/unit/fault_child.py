"""A training run that kills itself with SIGKILL at a chosen point (run by test_faults.py).

``main(MODE, DATA, PROJECT)`` - in a process of its own: test_faults.py forks one per mode, so that
each does not pay the interpreter's and torch's start, and ``python fault_child.py MODE DATA
PROJECT`` does the same from a shell - trains yolox-n for 2 epochs into PROJECT/run and, in
epoch 2, sends itself SIGKILL (the signal nothing can catch, as ``kill -9`` or the OOM killer)
from inside the operation that MODE names:

* ``ckpt``: while ``last.pt`` is being written: half of its bytes are in the temp file, flushed
  and fsync'ed, when the process dies;
* ``val``: during validation, after the first validation batch.

The kill is placed by patching the operation inside this process, so it lands there every
time (no race with a timer).
"""
import io
import os
import signal
import sys

import torch

torch.set_num_threads(1)


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(mode: str, data: str, project: str) -> None:
    from libreyolo import LibreYOLO
    from libreyolo.engine import hooks as H
    from libreyolo.tasks.detect.task import DetectionEvaluator

    if mode == "ckpt":
        real_save, saves = torch.save, [0]

        def dying_save(obj, f, *args, **kwargs):
            if ".last.pt." in os.path.basename(str(getattr(f, "name", ""))):
                saves[0] += 1
                if saves[0] == 2:      # epoch 2's last.pt
                    buf = io.BytesIO()
                    real_save(obj, buf, *args, **kwargs)
                    f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                    kill_self()
            return real_save(obj, f, *args, **kwargs)

        torch.save = dying_save
    elif mode == "val":
        real_validate, real_process, validations = H.EvaluationHook.validate, DetectionEvaluator.process, [0]

        def validate(self, *args, **kwargs):
            validations[0] += 1
            return real_validate(self, *args, **kwargs)

        def process(self, outputs, batch):
            real_process(self, outputs, batch)
            if validations[0] == 2:    # epoch 2's validation, one batch in
                kill_self()

        H.EvaluationHook.validate, DetectionEvaluator.process = validate, process
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    model = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0)
    model.train(**run_args(data, project))
    raise SystemExit("the run finished: the kill did not happen")


def run_args(data: str, project: str) -> dict:
    """The options of the killed run (the test resumes with the same)."""
    return dict(data=data, epochs=2, batch=4, imgsz=64, workers=0, project=project, name="run",
                warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, seed=0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
