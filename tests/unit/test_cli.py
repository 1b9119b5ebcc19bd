"""The CLI's option parsing and --help: the checks of libreyolo.options, aligned help text."""

from __future__ import annotations

import json
import re

import pytest

from libreyolo import cli
from libreyolo.cli import COMMANDS, PREDICT, TRAIN, _options_help, _parse, main


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model is a failure: a bad option must stop the command before that."""
    monkeypatch.setattr(cli, "_load", lambda *a, **k: pytest.fail("a model was loaded despite a bad option"))


# ---- --help -----------------------------------------------------------------------------------------


def help_entries(text: str, spec: dict) -> tuple[dict[str, str], set[int]]:
    """{option: its help text, continuation lines joined} and the set of help-column offsets."""
    lines = text.splitlines()
    start = lines.index("options (key=value or --key value):") + 1
    entries: dict[str, str] = {}
    columns = set()
    current = None
    for line in lines[start:]:
        m = re.match(r"^  (\w+)( +)(\S.*)$", line)
        if m and m.group(1) in spec and m.group(1) not in entries:
            current = m.group(1)
            columns.add(2 + len(current) + len(m.group(2)))
            entries[current] = m.group(3)
        else:
            assert current is not None and line.startswith(" "), line
            indent = len(line) - len(line.lstrip(" "))
            columns.add(indent)
            entries[current] += " " + line.strip()
    return entries, columns


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_lists_every_option_once_aligned_with_one_default_note(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    spec = COMMANDS[command][1]
    entries, columns = help_entries(out, spec)
    assert list(entries) == list(spec)
    assert len(columns) == 1, f"help text starts in several columns: {sorted(columns)}"
    assert columns == {2 + max(map(len, spec)) + 2}
    for key, text in entries.items():
        assert text.lower().count("default") <= 1, (key, text)
        assert "(default: None)" not in text
        assert text.startswith(spec[key].help.split()[0])
    options = out.split("options (key=value or --key value):\n", 1)[1]
    assert all(len(line) <= 90 for line in options.splitlines())


def test_help_default_notes():
    text = _options_help(TRAIN, width=200)
    # the column is as wide as the longest option name
    assert re.search(r"^  optimizer +SGD or AdamW \(default: the family's recipe, SGD for the YOLO families\)$",
                     text, re.M)
    assert re.search(r"^  epochs +training epochs \(default: 100\)$", text, re.M)
    assert re.search(r"^  exist_ok +reuse the run folder \(default: false\)$", text, re.M)
    assert re.search(r"^  lr0 +initial learning rate \(default: the family's, else 0.01 SGD, 0.001 AdamW\)$",
                     text, re.M)
    pred = _options_help(PREDICT, width=200)
    assert re.search(r"^  json +also write all detections to this JSON file$", pred, re.M)  # off: no note


def test_help_wraps_long_text_under_its_column():
    text = _options_help(TRAIN, width=60)
    col = 2 + max(map(len, TRAIN)) + 2
    for line in text.splitlines():
        assert len(line) <= 60
        assert line.startswith("  ") and (line[2] != " " or line[:col].strip() == "")


# ---- bad values stop the command before a model is loaded --------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["train", "amp=flase"], "amp must be false, true (the family's autocast dtype), fp16/float16/half or "
                             "bf16/bfloat16 (true/false also as true/1/yes/on and false/0/no/off), got 'flase'"),
    (["predict", "model=x.pt", "amp=flase"], "got 'flase'"),
    (["demo", "epochs=0"], "epochs must be an integer >= 1, got '0'"),
    (["bench", "runs=0"], "runs must be an integer >= 1, got '0'"),
    (["bench", "warmup=-1"], "warmup must be an integer >= 0, got '-1'"),
    (["train", "batch=0"], "batch must be an integer >= 1, got '0'"),
    (["train", "epochs=2.5"], "epochs must be an integer >= 1, got '2.5'"),
    (["train", "workers=-1"], "workers must be an integer in [0, 1000000], got '-1'"),
    (["train", "imgsz=640,480"], "imgsz='640,480' is not square: only square sizes are supported"),
    (["train", "lr0=0"], "lr0 must be a number > 0, got '0'"),
    (["train", "mosaic=1.5"], "mosaic must be a number in [0, 1], got '1.5'"),
    (["train", "optimizer=adam"], "optimizer must be one of SGD, AdamW, got 'adam'"),
    (["train", "resume=flase"], "resume must be true, false or the path of a last.pt file, got 'flase'"),
    (["train", "exist_ok=maybe"], "exist_ok must be true or false"),
    (["predict", "model=x.pt", "imgsz=0"], "imgsz must be a positive integer (pixels), got '0'"),
    (["predict", "model=x.pt", "imgsz=100000"], "imgsz=100000 is too large: at most 8192"),
    (["predict", "model=x.pt", "conf=abc"], "conf must be a number in [0, 1], got 'abc'"),
    (["val", "model=x.pt", "conf=5"], "conf must be a number in [0, 1], got '5'"),
    (["predict", "model=x.pt", "classes=1,,2"], ("classes='1,,2' has an empty entry: give ids or names separated "
                                                 "by commas")),
    (["predict", "model=x.pt", "cuda_graph=maybe"], "cuda_graph must be False, True or 'auto', got 'maybe'"),
    (["verify", "model=x.pt", "batch=1,0"], "batch must be an integer >= 1, got '0'"),
    (["verify", "model=x.pt", "batch=1,"], "batch must be integers separated by commas"),
])
def test_bad_values_are_usage_errors(argv, message, capsys, no_model):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"libreyolo {argv[0]}: ") and message in err, err


def test_values_are_converted_to_what_the_api_takes(tmp_path):
    opts = _parse(["amp=BF16", "classes=person,2", "imgsz=320", "save=no", "--cuda_graph", "conf=0.5"],
                  PREDICT, "predict")
    assert (opts["amp"], opts["classes"], opts["imgsz"], opts["save"], opts["cuda_graph"], opts["conf"]) == \
        ("bf16", "person,2", 320, False, True, 0.5)
    assert _parse(["amp=true"], PREDICT, "predict")["amp"] is True
    assert _parse(["amp=float16"], PREDICT, "predict")["amp"] == "fp16"
    assert _parse(["amp=off"], TRAIN, "train")["amp"] is False
    last = tmp_path / "last.pt"
    last.write_bytes(b"")
    assert _parse([f"resume={last}"], TRAIN, "train")["resume"] == str(last)
    assert _parse(["resume=Yes"], TRAIN, "train")["resume"] is True
    assert _parse([], TRAIN, "train")["resume"] is False
    assert _parse(["optimizer=adamw"], TRAIN, "train")["optimizer"] == "AdamW"


class FakeModel:
    """What cmd_predict needs of a model; records the predict call."""

    names = {0: "person", 1: "bicycle", 2: "car"}
    trained = True
    TASK, FAMILY, size = "detect", "fake", "t"

    class task_def:   # a detection model's predict options
        predict_defaults = {"conf": 0.25, "iou": 0.45, "max_det": 300, "classes": None}

    def __init__(self):
        self.kwargs = None

    def predict(self, source, **kwargs):
        self.kwargs = kwargs
        return []

    def graph_info(self):
        return {"graphs": [], "replays": 0, "fallbacks": []}


def test_predict_classes_by_name_are_resolved_with_the_models_names(monkeypatch, capsys):
    model = FakeModel()
    monkeypatch.setattr(cli, "_load", lambda opts, seed=None: model)
    assert main(["predict", "model=x.pt", "classes=car, 0", "save=false", "amp=fp16"]) == 0
    assert model.kwargs["classes"] == [2, 0] and model.kwargs["amp"] == "fp16"
    assert main(["predict", "model=x.pt", "classes=34", "save=false"]) == 2
    assert "classes: 34 is out of range: this model has 3 classes (ids 0..2)" in capsys.readouterr().err
    assert main(["predict", "model=x.pt", "classes=cra", "save=false"]) == 2
    assert "did you mean 'car'?" in capsys.readouterr().err
    # what is not given is the API's default, except what the command line does differently
    assert main(["predict", "model=x.pt", "save=false"]) == 0
    assert model.kwargs == {"save": False, "verbose": True, "cuda_graph": "auto"}
    assert main(["predict", "model=x.pt", "topk=3"]) == 2
    assert "topk is an option of classify models; fake-t is a detect model" in capsys.readouterr().err


def test_every_option_default_passes_its_own_check():
    """Defaults are not run through the converters: make sure none would be refused."""
    for command, (_, spec, _) in COMMANDS.items():
        for key, opt in spec.items():
            if opt.default is None or opt.conv is str:
                continue
            text = ",".join(map(str, opt.default)) if isinstance(opt.default, list) else str(opt.default)
            assert opt.conv(text) == opt.default, (command, key)


def test_train_and_val_of_a_classifier_through_the_cli(tmp_path, capsys):
    """The CLI's train and val follow the model's task (metric columns, no detection options)."""
    import numpy as np
    from PIL import Image
    for split in ("train", "val"):
        for k, name in enumerate(("dark", "light")):
            (tmp_path / "d" / split / name).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(np.full((40, 48, 3), 30 + 180 * k + i, np.uint8)).save(
                    tmp_path / "d" / split / name / f"{i}.png")
    args = ["model=resnet18", f"data={tmp_path / 'd'}", "imgsz=32", "batch=4", "workers=0", "device=cpu"]
    assert main(["train", *args, "epochs=1", f"project={tmp_path}", "name=r"]) == 0
    out = capsys.readouterr().out
    assert "top1" in out
    # where the process's wall went, on one line (rich may wrap it)
    line = " ".join(out[out.index("time: "):].split())
    assert "from the process's start to train()" in line and "in train(): set-up" in line, line
    best = tmp_path / "r" / "weights" / "best.pt"
    assert main(["val", f"model={best}", *args[1:4], "device=cpu"]) == 0
    out = capsys.readouterr().out
    assert "top1" in out and "top5" in out


# ---- demo -------------------------------------------------------------------------------------------


def test_demo_defaults_are_its_measured_configuration():
    """The demo's defaults (docs/benchmarks.md has the measured run): yolo9-t from scratch on the
    easy shapes at 128 px, AdamW, each batch an update (nbs = batch), mosaic closed for the last
    third, one warm-up epoch; the held-out picture at predict's default conf."""
    opts = _parse([], cli.DEMO, "demo")
    assert opts["model"] == "yolo9t" and opts["conf"] == PREDICT["conf"].default == 0.25
    args = cli.demo_train_args(opts)
    assert args == dict(epochs=10, imgsz=128, batch=8, optimizer="AdamW", lr0=0.002, workers=None,
                        project="runs/demo", name="train", close_mosaic=3, warmup_epochs=1.0, nbs=8,
                        exist_ok=True, seed=0)
    assert cli.demo_train_args({**opts, "epochs": 2})["close_mosaic"] == 1
    assert cli.demo_train_args({**opts, "epochs": 2})["warmup_epochs"] == pytest.approx(2 / 3)
    assert cli.demo_train_args({**opts, "close_mosaic": 0})["close_mosaic"] == 0
    assert cli.DEMO_DATA == {"style": "easy", "n_train": 320, "n_val": 64, "imgsz": 320}


def test_demo_reports_the_metrics_of_best_pt_not_the_last_epochs(tmp_path, monkeypatch, capsys):
    """The metrics printed are the ones best.pt carries (its epoch named), not the last epoch's:
    training is replaced by one that writes a best.pt of epoch 2 whose metrics differ from the
    run's final ones. The held-out image is a validation image, predicted with best.pt."""
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.data.datasets import resolve_data
    from libreyolo.weights import save_checkpoint

    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path / "datasets"))
    monkeypatch.setitem(cli.DEMO_DATA, "n_train", 4)
    monkeypatch.setitem(cli.DEMO_DATA, "n_val", 3)
    monkeypatch.setitem(cli.DEMO_DATA, "imgsz", 64)
    torch.manual_seed(0)
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
    calls = {}

    def fake_train(data, **kw):
        calls.update(kw, data=data)
        best = tmp_path / "run" / "weights" / "best.pt"
        ck = model.checkpoint_of(model.model)
        ck["train_metrics"] = {"map50": 0.712, "map50_95": 0.433, "precision": 0.8, "recall": 0.7}
        save_checkpoint(ck, best)
        return {"best": str(best), "best_epoch": 2, "epochs": 5, "time_s": 12.0, "map50": 0.111,
                "map50_95": 0.05, "best_metrics": ck["train_metrics"]}

    model.train = fake_train
    monkeypatch.setattr(cli, "_load", lambda opts, seed=None: model)
    assert main(["demo", "imgsz=64", "workers=0", "device=cpu", f"project={tmp_path / 'demo'}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "epoch 2 of 5" in out and "mAP50 0.712, mAP50-95 0.433, precision 0.800, recall 0.700" in out, out
    assert "0.111" not in out
    data = resolve_data(calls["data"])
    assert "easy" in calls["data"] and len(data.val) == 3 and calls["nbs"] == calls["batch"] == 8
    held = max(data.val, key=lambda s: len(s.labels))
    assert f"held-out image {held.image.name} ({len(held.labels)} objects)" in out
    assert "/val/" in str(held.image).replace("\\", "/")
    assert (tmp_path / "demo" / "prediction.jpg").stat().st_size > 0
    assert re.search(r"the demo took \d+ s", out)


def test_demo_matches_counts_objects_found_with_the_right_class():
    """One box per object at most, the most confident first, the class must agree, IoU >= 0.5."""
    from pathlib import Path

    import numpy as np
    import torch

    from libreyolo.data.datasets import Sample
    from libreyolo.results import Boxes, Results

    w, h = 200, 100
    # objects: class 0 at (0..50, 0..50) px, class 1 at (100..150, 0..50), class 2 at (0..20, 60..80)
    labels = np.array([[0, 0, 0, .25, .5], [1, .5, 0, .75, .5], [2, 0, .6, .1, .8]], np.float32)
    sample = Sample(image=Path("x.jpg"), labels=labels, width=w, height=h)

    def result(rows):
        data = torch.tensor(rows, dtype=torch.float32).reshape(-1, 6)
        return Results(np.zeros((h, w, 3), np.uint8), "x.jpg", {0: "a", 1: "b", 2: "c"}, Boxes(data, (h, w)))

    assert cli.demo_matches(result([]), sample) == 0
    rows = [[0, 0, 50, 50, .9, 0],      # object 0, right class
            [2, 2, 48, 48, .8, 0],      # object 0 again: already taken
            [100, 0, 150, 50, .7, 2],   # object 1, wrong class
            [0, 60, 20, 80, .6, 2],     # object 2, right class
            [120, 0, 170, 50, .5, 1]]   # object 1's class, IoU 1/3: too far
    assert cli.demo_matches(result(rows), sample) == 2
    assert cli.demo_matches(result(rows[:1] + [[100, 0, 150, 50, .4, 1]]), sample) == 2


def test_demo_runs_end_to_end_and_its_numbers_are_best_pts(tmp_path, monkeypatch, capsys):
    """The main job, shrunk (a 16-image easy set, 2 epochs at 64 px): train, print best.pt's
    validation (a fresh validation of best.pt gives the same numbers), predict a held-out image
    and save the annotated picture (here with the fallback that shows a weak model's guesses)."""
    from pathlib import Path

    from libreyolo import LibreYOLO

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path / "datasets"))
    for k, v in (("n_train", 16), ("n_val", 4), ("imgsz", 64)):
        monkeypatch.setitem(cli.DEMO_DATA, k, v)
    assert main(["demo", "epochs=2", "imgsz=64", "workers=0", "device=cpu", "conf=0.99"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    best = Path("runs/demo/train/weights/best.pt")
    assert Path("runs/demo/prediction.jpg").stat().st_size > 0
    m = re.search(r"validation of (\S+) \(epoch ([12]) of 2; \d+ s of training\) on the 4 held-out images: "
                  r"mAP50 ([\d.]+), mAP50-95 ([\d.]+)", out)
    assert m, out
    assert Path(m[1]) == best
    data = tmp_path / "datasets" / "shapes-v1-easy-16-4-64-0" / "data.yaml"
    v = LibreYOLO(str(best), device="cpu").val(data=str(data), imgsz=64, batch=8, workers=0)
    assert float(m[3]) == pytest.approx(v["map50"], abs=6e-4)
    assert float(m[4]) == pytest.approx(v["map50_95"], abs=6e-4)
    assert "none reached conf 0.99" in out and "objects found with the right class" in out


# ---- the program's start ---------------------------------------------------------------------------


def test_the_program_parses_its_command_line_before_importing_torch():
    """``import libreyolo.cli`` imports neither torch nor the families (the package's names load
    on first use): ``libreyolo --help`` and a bad option answer without torch's import."""
    import subprocess
    import sys
    code = ("import sys, libreyolo.cli; assert 'torch' not in sys.modules, 'torch'; "
            "from libreyolo import LibreYOLO, SAMPLE_IMAGE, list_models; import libreyolo; "
            "assert 'torch' in sys.modules and 'list_models' in dir(libreyolo); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_errors_go_to_standard_error(tmp_path, capsys):
    """A failing command prints its error on standard error, so a pipe of its output stays clean."""
    missing = tmp_path / "nope.png"
    assert main(["predict", "model=yolo9t", f"source={missing}", "device=cpu"]) == 1
    captured = capsys.readouterr()
    assert "nope.png" in captured.err and "error" in captured.err
    assert "nope.png" not in captured.out


def test_info_lists_families_per_task_with_their_graph_status(capsys):
    """`libreyolo info` groups the families by task, a family's variants (RTMDet's instance
    segmentation, EC's pose, EoMT's panoptic head) under their own tasks, each with its graph status."""
    from libreyolo import cli
    from libreyolo.models.registry import get_family
    from libreyolo.tasks import TASKS
    assert cli.cmd_info({"json": True}) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["tasks"]) == set(TASKS)
    assert "rtmdet" in data["tasks"]["segment"] and "rtmdet" in data["tasks"]["detect"]
    assert "eomt" in data["tasks"]["panoptic"] and "fomo" in data["tasks"]["point"]
    rtmdet = next(m for m in data["models"] if m["family"] == "rtmdet")
    seg = next(v for v in rtmdet["variants"] if v["task"] == "segment")
    assert seg["cuda_graph"] == get_family("rtmdet").for_task("segment").SUPPORTS_CUDA_GRAPH
    assert cli.cmd_info({"json": False}) == 0
    text = capsys.readouterr().out
    for name in TASKS:   # a heading (narrow output) or a table row (wide) for every task
        assert name in text
    assert "LibreRTMDet<size>-seg.pt" in text


def test_an_exit_held_up_after_ctrl_c_ends_anyway_with_the_threads_stacks():
    """A thread that never finishes (a library's non-daemon worker) cannot keep the program alive
    after Ctrl-C: after EXIT_AFTER_INTERRUPT_S the process ends with 130, printing what held it up."""
    import subprocess
    import sys
    code = (
        "import threading, libreyolo.cli as c\n"
        "c.EXIT_AFTER_INTERRUPT_S = 1.0\n"
        "def stuck_worker():\n    threading.Event().wait()\n"
        "def main():\n    threading.Thread(target=stuck_worker, name='stuck').start()\n    raise KeyboardInterrupt\n"
        "c.main = main\nc.entry()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr[-2000:]
    assert "libreyolo: interrupted" in done.stderr and "still exiting 1 s after Ctrl-C" in done.stderr
    assert "stuck_worker" in done.stderr and "Traceback" not in done.stderr
