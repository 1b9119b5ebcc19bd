"""loggers=mlflow,wandb,comet,clearml,dvclive: each tracker's offline mode gets the run's
hyperparameters, every epoch's losses and metrics, the plots and best.pt; a tracker that fails
is one warning and the run goes on.

Each tracker runs in a child interpreter (a real two-epoch training): the trackers patch
interpreter-wide state when they start (exit handlers, output capture, framework hooks), which
must not reach the other tests. A tracker whose package is not installed is skipped."""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine.loggers import EXPERIMENT_LOGGERS, ExperimentLogger
from libreyolo.options import LOGGERS, OptionError, parse_loggers

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
from pathlib import Path
from libreyolo import LibreYOLO
out, data, loggers = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
m = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0)
res = m.train(data=data, epochs=2, batch=8, imgsz=64, workers=0, project=str(out / "proj"), name="run",
              warmup_epochs=0, close_mosaic=0, verbose=False, plots=True, seed=0, loggers=loggers)
(out / "res.json").write_text(json.dumps({"history": res["history"], "run_dir": res["run_dir"]}))
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("loggers") / "ds", n_train=8, n_val=4, imgsz=64, seed=0))


def train_in_child(tmp_path: Path, data: str, logger: str, **env: str) -> tuple[dict, Path, str]:
    """Two epochs with ``loggers=logger`` in a child interpreter with a private HOME, no tracker
    credentials and ``env``; returns (its history and run folder, the output)."""
    spec = {"mlflow": "mlflow", "wandb": "wandb", "comet": "comet_ml", "clearml": "clearml", "dvclive": "dvclive"}
    if importlib.util.find_spec(spec[logger]) is None:
        pytest.skip(f"{spec[logger]} is not installed")
    home = tmp_path / "home"
    home.mkdir()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("WANDB_", "COMET_", "CLEARML_", "MLFLOW_", "DVC"))}
    base.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")]),
                OMP_NUM_THREADS="1", **env)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), data, logger], env=base, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert f"loggers={logger}:" not in output, output[-4000:]   # no failure warning of ours
    res = json.loads((tmp_path / "res.json").read_text())
    return res, Path(res["run_dir"]), output


PLOTS = {"results", "pr_curve", "confusion_matrix"}


def losses(res: dict, key: str = "train/iou_loss") -> list[float]:
    return [h[key] for h in res["history"]]


def test_mlflow_file_store_gets_params_metrics_plots_and_best(data, tmp_path):
    store = tmp_path / "mlruns"
    res, run_dir, _ = train_in_child(tmp_path, data, "mlflow", MLFLOW_TRACKING_URI=store.as_uri(),
                                     MLFLOW_ALLOW_FILE_STORE="true")
    (run,) = [p for p in store.glob("*/*") if (p / "meta.yaml").is_file()]
    assert (run / "tags" / "mlflow.runName").read_text() == "run"
    assert (run.parent / "meta.yaml").read_text().count("name: proj") == 1   # experiment: the project folder
    params = {p.name: p.read_text() for p in (run / "params").iterdir()}
    assert params["epochs"] == "2" and params["model_family"] == "yolox" and params["model_size"] == "n"
    lines = [line.split() for line in (run / "metrics" / "train" / "iou_loss").read_text().splitlines()]
    assert [int(s) for _, _, s in lines] == [1, 2]
    assert [float(v) for _, v, _ in lines] == pytest.approx(losses(res), rel=1e-6)
    assert (run / "metrics" / "lr" / "pg2").is_file() and (run / "metrics" / "metrics" / "mAP50-95").is_file()
    art = run / "artifacts"
    assert {p.stem for p in (art / "plots").iterdir()} >= PLOTS
    assert (art / "results.csv").is_file()
    assert (art / "weights" / "best.pt").read_bytes() == (run_dir / "weights" / "best.pt").read_bytes()
    assert "status: 3" in (run / "meta.yaml").read_text()   # FINISHED


def _wandb_records(path: Path):
    """The protobuf records of a W&B run file (LevelDB log format: 32 KiB blocks of records with
    a 7-byte header - CRC, length, type: 1 full, 2 first, 3 middle, 4 last - after a 7-byte file
    header)."""
    from wandb.proto import wandb_internal_pb2 as pb
    raw, pos, block, pending = path.read_bytes(), 7, 32768, b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending + chunk if kind == 4 else chunk)
            pending = b""
            yield record
        else:
            pending = chunk if kind == 2 else pending + chunk


def test_wandb_offline_run_gets_metrics_plots_and_best(data, tmp_path):
    res, run_dir, _ = train_in_child(tmp_path, data, "wandb", WANDB_MODE="offline", WANDB_SILENT="true")
    (run,) = (run_dir / "wandb").glob("offline-run-*")
    history, artifacts, config = [], [], {}
    for r in _wandb_records(next(run.glob("run-*.wandb"))):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): i.value_json for i in r.history.item})
        elif kind == "artifact":
            artifacts.append((r.artifact.type, [m.path for m in r.artifact.manifest.contents]))
        elif kind == "run":
            assert r.run.display_name == "run" and r.run.project == "proj"
            config = {u.key: u.value_json for u in r.run.config.update}
    rows = [h for h in history if "train/iou_loss" in h]
    assert [float(h["train/iou_loss"]) for h in rows] == pytest.approx(losses(res), rel=1e-6)
    assert [int(h["epoch"]) for h in rows] == [1, 2]
    assert json.loads(config["epochs"]) == 2 and json.loads(config["model_family"]) == "yolox"
    assert ("model", ["best.pt"]) in artifacts
    images = {p.name.rsplit("_", 2)[0] for p in (run / "files" / "media" / "images" / "plots").iterdir()}
    assert images >= PLOTS and (run / "files" / "results.csv").is_file()


def test_comet_offline_experiment_gets_params_metrics_plots_and_best(data, tmp_path):
    res, run_dir, _ = train_in_child(tmp_path, data, "comet")
    (archive,) = (run_dir / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as z:
        messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines() if line.strip()]
    metrics = [m["payload"]["metric"] for m in messages if m.get("type") == "metric_msg"]
    iou = sorted((m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "train/iou_loss")
    assert [s for s, _ in iou] == [1, 2] and [v for _, v in iou] == pytest.approx(losses(res), rel=1e-6)
    params = {m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
              for m in messages if m.get("type") == "parameter_msg" and "param" in m["payload"]}
    assert str(params["epochs"]) == "2" and params["model_family"] == "yolox"
    uploads = [m["payload"] for m in messages if m.get("type") == "file_upload"]
    figures = {u["additional_params"].get("figName") for u in uploads if u["upload_type"] == "visualization"}
    assert figures >= PLOTS
    files = {u["additional_params"].get("fileName"): u for u in uploads}
    assert files["best.pt"]["additional_params"]["groupingName"] == "best" and "results.csv" in files


def test_clearml_offline_session_gets_params_scalars_plots_and_best(data, tmp_path):
    cache = tmp_path / "clearml"
    res, _, _ = train_in_child(tmp_path, data, "clearml", CLEARML_OFFLINE_MODE="1", CLEARML_CACHE_DIR=str(cache))
    (session,) = [p for p in (cache / "offline").iterdir() if p.is_dir()]
    events = [e for line in (session / "metrics.jsonl").read_text().splitlines() for e in json.loads(line)]
    iou = sorted((e["iter"], e["value"]) for e in events
                 if e["type"] == "training_stats_scalar" and (e["metric"], e["variant"]) == ("train", "iou_loss"))
    assert [i for i, _ in iou] == [1, 2] and [v for _, v in iou] == pytest.approx(losses(res), rel=1e-6)
    assert {e["variant"] for e in events if e["type"] == "training_debug_image"} >= PLOTS
    task = json.loads((session / "task.json").read_text())
    assert task["name"] == "run" and task["project_name"] == "proj"
    hyper = task["hyperparams"]["Hyperparameters"]
    assert hyper["epochs"]["value"] == "2" and hyper["model_family"]["value"] == "yolox"
    assert {a["key"] for a in task["execution"]["artifacts"]} >= {"best.pt", "results.csv"}


def test_dvclive_writes_params_metrics_and_plots(data, tmp_path):
    res, run_dir, _ = train_in_child(tmp_path, data, "dvclive")
    live = run_dir / "dvclive"
    rows = (live / "plots" / "metrics" / "train" / "iou_loss.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["step", "iou_loss"]
    assert [int(r.split("\t")[0]) for r in rows[1:]] == [1, 2]
    assert [float(r.split("\t")[1]) for r in rows[1:]] == pytest.approx(losses(res), rel=1e-6)
    summary = json.loads((live / "metrics.json").read_text())
    assert summary["train"]["iou_loss"] == pytest.approx(losses(res)[-1], rel=1e-6)
    params = (live / "params.yaml").read_text()
    assert "epochs: 2" in params and "model_family: yolox" in params
    assert {p.stem for p in (live / "plots" / "images").iterdir()} >= PLOTS


# ------------------------------------------------------------------------------------------------
# Without any tracker package: the option, the missing package, a failing tracker
# ------------------------------------------------------------------------------------------------


def test_loggers_option_names_every_tracker():
    assert set(EXPERIMENT_LOGGERS) | {"tensorboard"} == set(LOGGERS)
    assert parse_loggers("mlflow, wandb,mlflow") == ("mlflow", "wandb")
    with pytest.raises(OptionError, match="loggers must be one of tensorboard, mlflow, wandb, comet, clearml, "
                                          "dvclive, got 'neptune'"):
        parse_loggers("neptune")


@pytest.mark.parametrize("name", sorted(EXPERIMENT_LOGGERS))
def test_missing_tracker_package_is_a_clear_error_before_any_work(name, monkeypatch):
    hook = EXPERIMENT_LOGGERS[name]
    monkeypatch.setitem(sys.modules, hook.PACKAGE, None)   # as if not installed
    with pytest.raises(ImportError, match=rf"loggers={name} needs the {hook.PIP} package: pip install "
                                          rf"{hook.PIP} \(or pip install 'libreyolo-graphs\[{hook.EXTRA}\]'\)"):
        LibreYOLO.new("yolox", "n", device="cpu").train(data="nowhere", loggers=name)   # before the data


class Flaky(ExperimentLogger):
    """A tracker (on a package every interpreter has) whose ``fail`` call raises."""

    NAME, PACKAGE, PIP, EXTRA = "flaky", "json", "json", "flaky"

    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail, self.calls = fail, []

    def _call(self, what: str, *args) -> None:
        self.calls.append(what)
        if what == self.fail:
            raise ConnectionError(f"the tracking server went away during {what}")

    def start(self, t, run_dir, params):
        assert params["epochs"] == 3 and params["model_family"] == "yolox"
        self._call("start")

    def log_epoch(self, epoch, metrics):
        assert "train/iou_loss" in metrics and "lr/pg0" in metrics
        self._call(f"epoch{epoch}")

    def log_files(self, files, best):
        assert best is not None and best.name == "best.pt" and any(f.name == "results.csv" for f in files)
        self._call("files")

    def finish(self, failed):
        self._call("finish" if not failed else "finish-failed")


@pytest.mark.parametrize("fail", ["start", "epoch2", "files", "finish"])
def test_a_failing_tracker_is_one_warning_and_training_goes_on(fail, data, tmp_path, caplog):
    hook = Flaky(fail)
    model = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        res = model.train(data=data, epochs=3, batch=8, imgsz=64, workers=0, project=str(tmp_path), name="run",
                          warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, seed=0, callbacks=[hook])
    assert res["epochs"] == 3 and Path(res["best"]).is_file()
    warnings = [r.getMessage() for r in caplog.records if "loggers=flaky" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "so this run logs nothing more there (training goes on)" in warnings[0]
    assert f"the tracking server went away during {fail}" in warnings[0]
    expected = {"start": ["start"],
                "epoch2": ["start", "epoch1", "epoch2", "finish"],     # no more logging, but the run is ended
                "files": ["start", "epoch1", "epoch2", "epoch3", "files", "finish"],
                "finish": ["start", "epoch1", "epoch2", "epoch3", "files", "finish"]}[fail]
    assert hook.calls == expected
