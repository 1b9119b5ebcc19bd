"""Checkpoints saved here, loaded by the reference library (LibreYOLO 1.6.0) in its own interpreter.

For every family (``--families`` to choose): an untrained model of the smallest size is built
here and saved with ``model.save``; the reference's ``LibreYOLO(path)`` then loads each file in the
other interpreter (MobileSAM: its ``LibreMobileSAM("tiny")``, the only way it builds that family,
from the file put in its weights folder) (``--ref-python``), which reports the class it built, its task and class count,
and how many of the file's tensors its network holds with the same name, shape and values. The
report (one row per family, JSON with ``--json``) ends with how many loaded.

Run from the repository root with the repository's interpreter:

    PYTHONPATH=. python scripts/reference_load.py --ref-python /path/to/ref-venv/bin/python

The same file runs as the reference-side worker (``--worker``); it then imports the reference's
``libreyolo`` and never this repository's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: family -> the size built (the smallest)
SIZES = {
    "yolo9": "t", "yolox": "n", "yolo7": "b", "rtmdet": "t", "picodet": "s", "rtdetr": "r18",
    "rtdetrv2": "r18", "dfine": "n", "deim": "n", "deimv2": "atto", "ec": "s", "rtdetrv4": "s",
    "resnet": "18", "efficientnetv2": "b0", "mobilenetv4": "s", "convnext": "t", "segformer": "b0",
    "mobilesam": "tiny", "depth_anything": "s", "birefnet": "t", "ppocr": "t",
}


def worker(job_path: str) -> None:
    """Reference side: load each checkpoint and compare its tensors with the network's."""
    import torch

    import libreyolo
    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    report = {}
    for fam, path in job["checkpoints"].items():
        try:
            model = _mobilesam(path) if fam == "mobilesam" else libreyolo.LibreYOLO(path, device="cpu")
        except Exception as e:  # noqa: BLE001 - reported, the other families go on
            report[fam] = {"loaded": False, "error": f"{type(e).__name__}: {e}"[:400]}
            continue
        saved = torch.load(path, map_location="cpu", weights_only=False)["model"]
        net = getattr(model, "model", None)
        theirs = net.state_dict() if isinstance(net, torch.nn.Module) else {}
        same = sum(1 for k, v in saved.items() if k in theirs and theirs[k].shape == v.shape
                   and torch.equal(theirs[k].to(v.dtype), v))
        report[fam] = {"loaded": True, "class": type(model).__name__, "task": getattr(model, "task", None),
                       "nb_classes": getattr(model, "nb_classes", None), "tensors": len(saved),
                       "tensors_equal": same}
    print(json.dumps(report))


def _mobilesam(path: str):
    """That library builds MobileSAM only as ``LibreMobileSAM("tiny")``, from its weights folder
    (``weights/LibreMobileSAMtiny/LibreMobileSAM.pt`` under the working directory, with the marker
    its download writes last), checking the file's ``model_family``, ``size`` and ``task``: the
    checkpoint is put there, in a folder of its own, and loaded so."""
    import shutil

    from libreyolo import LibreMobileSAM
    root = Path(tempfile.mkdtemp())
    folder = root / "weights" / f"{LibreMobileSAM.FILENAME_PREFIX}tiny"
    folder.mkdir(parents=True)
    shutil.copyfile(path, folder / LibreMobileSAM.WEIGHT_FILE)
    (folder / ".libreyolo_snapshot_complete").write_text(json.dumps({"repo": LibreMobileSAM.HF_REPOS["tiny"]}))
    here = os.getcwd()
    os.chdir(root)
    try:
        return LibreMobileSAM("tiny", device="cpu")
    finally:
        os.chdir(here)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref-python", default="/work/venv-ref/bin/python")
    ap.add_argument("--families", default=",".join(SIZES))
    ap.add_argument("--json", default=None, help="also write the report here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return
    from libreyolo import LibreYOLO
    families = [f for f in a.families.split(",") if f]
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = {}
        for fam in families:
            model = LibreYOLO.new(fam, SIZES[fam], device="cpu", seed=0)
            ckpts[fam] = str(model.save(Path(tmp) / f"{fam}.pt"))
            print(f"saved {fam}-{SIZES[fam]} (task {model.task})", file=sys.stderr)
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"checkpoints": ckpts}))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.setdefault("OMP_NUM_THREADS", "2")
        done = subprocess.run([a.ref_python, os.path.abspath(__file__), "--worker", str(job)], cwd="/", env=env,
                              capture_output=True, text=True, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for fam in families:
        row = report.get(fam, {"loaded": False, "error": "not reported"})
        if row["loaded"]:
            print(f"{fam:15s} loaded as {row['class']} (task {row['task']}, {row['nb_classes']} classes): "
                  f"{row['tensors_equal']}/{row['tensors']} tensors equal")
        else:
            print(f"{fam:15s} NOT loaded: {row['error']}")
    print(f"{sum(r['loaded'] for r in report.values())} of {len(families)} loaded")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
