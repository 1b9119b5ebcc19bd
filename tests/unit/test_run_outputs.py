"""What predict and train leave on disk and print: run folders, file names, checkpoints, the
per-epoch line of the Python API."""
import logging
import os

import numpy as np
import pytest
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine.paths import UniqueNames, next_run_dir


def test_unique_names_and_next_run_dir(tmp_path):
    u = UniqueNames()
    assert [u("a"), u("a"), u("b"), u("a"), u("")] == ["a.jpg", "a_2.jpg", "b.jpg", "a_3.jpg", "image.jpg"]
    assert next_run_dir(tmp_path, "predict") == tmp_path / "predict"
    (tmp_path / "predict").mkdir()
    (tmp_path / "predict2").mkdir()
    assert next_run_dir(tmp_path, "predict") == tmp_path / "predict3"
    assert next_run_dir(tmp_path, "predict", exist_ok=True) == tmp_path / "predict"


def test_predict_save_numbers_runs_and_keeps_same_stems_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for sub, shade in (("x", 40), ("y", 200)):
        (tmp_path / sub).mkdir()
        Image.fromarray(np.full((48, 64, 3), shade, np.uint8)).save(tmp_path / sub / "a.png")
    model = LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0)
    sources = [str(tmp_path / "x" / "a.png"), str(tmp_path / "y" / "a.png")]
    results = model(sources, imgsz=64, save=True)
    first = sorted(os.listdir(tmp_path / "runs" / "detect" / "predict"))   # runs/<task>/predict
    assert first == ["a.jpg", "a_2.jpg"]
    assert [r.save_dir for r in results] == [os.path.join("runs", "detect", "predict")] * 2
    results = model(sources[:1], imgsz=64, save=True)
    assert os.listdir(tmp_path / "runs" / "detect" / "predict2") == ["a.jpg"]
    assert results[0].save_dir == os.path.join("runs", "detect", "predict2")
    model(sources[:1], imgsz=64, save=True, exist_ok=True)
    assert not (tmp_path / "runs" / "detect" / "predict3").exists()
    assert model(sources[:1], imgsz=64)[0].save_dir is None
    with pytest.raises(TypeError, match="unknown predict option"):
        model(sources[:1], imgsz=64, sav=True)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("d") / "s", n_train=8, n_val=4, imgsz=64, seed=0))


def test_python_training_prints_the_per_epoch_line_and_writes_lean_best(tmp_path, tiny_data, capsys, monkeypatch):
    """With logging unconfigured (as in a plain script) train(verbose=True) still prints one line
    per epoch; verbose=False prints none. best.pt holds no optimizer state (last.pt does, for
    resume) and both load."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])          # a plain script: no logging configured
    monkeypatch.setattr(logging.getLogger("libreyolo"), "propagate", False)
    model = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0)
    res = model.train(data=tiny_data, epochs=2, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="r",
                      warmup_epochs=0, close_mosaic=0, verbose=True, plots=False)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("libreyolo: epoch ")]
    assert len(lines) == 2 and "mAP50" in lines[0] and "epoch 2/2" in lines[1], err[-2000:]
    assert not logging.getLogger("libreyolo").handlers    # the run's handler is gone again
    model.train(data=tiny_data, epochs=1, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="q",
                warmup_epochs=0, close_mosaic=0, verbose=False, plots=False)
    assert "libreyolo: epoch" not in capsys.readouterr().err
    best, last = os.path.getsize(res["best"]), os.path.getsize(res["last"])
    assert best < 0.6 * last, (best, last)
    assert LibreYOLO(res["best"], device="cpu").trained and LibreYOLO(res["last"], device="cpu").trained
    assert res["best_metrics"] and set(res["best_metrics"]) >= {"map50", "map50_95"}
    assert res["best_epoch"] in (1, 2)


def test_run_folders_are_runs_task_mode(tmp_path, monkeypatch):
    """runs/<task>/<mode>, numbered: train, train2; val's predictions.json in runs/<task>/val."""
    from libreyolo.engine.config import TrainConfig
    from libreyolo.engine.runs import RunFolder
    cfg = TrainConfig("detect")
    assert (cfg.run.project, cfg.run.name) == (os.path.join("runs", "detect"), "train")
    assert TrainConfig("classify").run.project == os.path.join("runs", "classify")
    cfg = TrainConfig("detect", project="p", name="n")
    assert (cfg.run.project, cfg.run.name) == ("p", "n")
    monkeypatch.chdir(tmp_path)
    first = RunFolder.claim(TrainConfig("detect").run)
    second = RunFolder.claim(TrainConfig("detect").run)
    try:
        assert first.path.resolve() == (tmp_path / "runs" / "detect" / "train").resolve()
        assert second.path.resolve() == (tmp_path / "runs" / "detect" / "train2").resolve()
    finally:
        first.release()
        second.release()


def test_predict_save_says_where_from_python(tmp_path, monkeypatch, capsys):
    """A plain script (no logging set up) is told where predict(save=True) wrote."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger("libreyolo"), "propagate", False)
    model = LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0)
    model(np.zeros((48, 64, 3), np.uint8), imgsz=64, save=True)
    err = capsys.readouterr().err
    assert f"libreyolo: saved 1 annotated image(s) to {os.path.join('runs', 'detect', 'predict')}\n" in err


def test_cli_lines_never_break_a_path(monkeypatch):
    """Piped or at 80 columns, a long path stays on one line (the terminal may fold it, nothing cuts it)."""
    import io

    from rich.console import Console

    from libreyolo import cli
    assert cli.console.soft_wrap   # the command line's console: printed lines are never broken
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=80, soft_wrap=cli.console.soft_wrap))
    path = "runs/detect/" + "a-rather-long-run-name-" * 5 + "/weights/best.pt"
    cli.console.print(f"weights: [bold]{path}[/] (best), {path} (last)")
    assert out.getvalue().count("\n") == 1 and path in out.getvalue()


def test_val_neither_caches_nor_loads_the_train_split(tiny_data, monkeypatch):
    """model.val reads the validation split alone: the training split's labels are not parsed
    (its dataset is never built), its images not cached (cache=auto would decode them all), and
    it gets no loader."""
    from libreyolo.data.augment import DetectionDataset
    from libreyolo.engine import loaders as L
    cached, built, opened = [], [], []
    real_cache, real_build, real_init = DetectionDataset.cache_images, L.build_loaders, DetectionDataset.__init__

    def init(self, *a, **k):
        opened.append(bool(k.get("augment", False)))
        real_init(self, *a, **k)
    monkeypatch.setattr(DetectionDataset, "__init__", init)
    monkeypatch.setattr(DetectionDataset, "cache_images",
                        lambda self, *a, **k: (cached.append(self.augment), real_cache(self, *a, **k))[1])
    monkeypatch.setattr(L, "build_loaders", lambda *a, **k: built.append(real_build(*a, **k)) or built[-1])
    model = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0)
    metrics = model.val(data=tiny_data, imgsz=64, batch=4, workers=0)
    assert "map50" in metrics
    assert cached == [False]   # the validation split's images only
    assert opened == [False]   # one dataset built: the validation split's
    assert built and built[0].train is None and built[0].train_set is None
