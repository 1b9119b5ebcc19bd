"""The README's first Python snippet runs as written on a CPU, offline, once ``libreyolo demo``
has trained its weights (here: a one-epoch stand-in of that run, at the path the demo writes)."""
from __future__ import annotations

import re
from pathlib import Path

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset

README = Path(__file__).resolve().parents[2] / "README.md"


def first_python_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python code block"
    return blocks[0]


def test_first_snippet_runs_on_the_cpu_offline(tmp_path, monkeypatch):
    code = first_python_snippet()
    assert "cuda_graph=True" not in code and "LibreYOLO9t.pt" not in code   # no GPU, no download needed
    assert "runs/demo/train/weights/best.pt" in code
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "1")
    data = make_shapes_dataset(tmp_path / "ds", n_train=8, n_val=4, imgsz=64, seed=0, style="easy")
    LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0).train(   # what `libreyolo demo` leaves, CPU-sized
        data=str(data), epochs=1, batch=8, imgsz=64, workers=0, project="runs/demo", name="train", exist_ok=True,
        plots=False, verbose=False, device="cpu")
    namespace: dict = {}
    exec(compile(code, str(README) + ":first python block", "exec"), namespace)
    r = namespace["r"]
    assert (tmp_path / "out.jpg").is_file() and r.orig_shape == (720, 1280)
