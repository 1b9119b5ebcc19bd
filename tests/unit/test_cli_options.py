"""The CLI and the Python API accept and refuse the same values, with the same messages.

The options are walked from their dataclasses (the training groups of ``engine.config.GROUPS``,
each task's Options, ``engine.call_options``): for each option a valid value (derived from its
check, or from :data:`SAMPLES`) is accepted by both and reaches the API as the same value, and an
invalid one is refused by both with the same message. Booleans travel as true/false text, None as
``auto``. An option whose check cannot be sampled here fails the test: add it to :data:`SAMPLES`.
"""

from __future__ import annotations

from typing import Any

import pytest

from libreyolo import cli
from libreyolo.engine import call_options as CO
from libreyolo.engine import config as C
from libreyolo.options import Check, OptionError, OptionInfo, option_fields
from libreyolo.tasks import TASKS, get_task

#: a model name of each task (its task is known from the name, before any model is loaded)
MODEL_OF = {"detect": "yolo9t", "classify": "resnet18", "semantic": "segformer-b0", "depth": "depth_anything-s",
            "segment-prompt": "mobilesam-tiny", "matte": "birefnet-t", "ocr": "ppocr-t", "pose": "ec-s-pose",
            "segment": "rtmdet-t-seg", "obb": "rtdetrv2-n-obb"}
MODEL_OF["panoptic"] = "eomt-s-panoptic"
MODEL_OF["restore"] = "nafnet-s"
MODEL_OF["point"] = "fomo-s"

#: (valid, invalid) of the options whose check is their own; invalid None: the option takes any text
SAMPLES: dict[str, tuple[Any, Any]] = {
    "imgsz": (320, 0),
    "device": ("cpu", None),
    "data": ("shapes", None),
    "project": ("runs/x", None),
    "name": ("run", None),
    "save_dir": ("out", None),
    "file": ("m.onnx", None),
    "points": ("10,20", None),
    "labels": ("1", None),
    "prompts": ("a cat,a dog", None),
    "boxes": ("1,2,30,40", None),
    "mask_input": ("mask.png", None),
    "cache": ("ram", "sometimes"),
    "freeze": (3, -1),
    "loggers": ("tensorboard", "neptune"),
    "amp": ("bf16", "flase"),
    "cuda_graph": ("auto", "maybe"),
    "precision": ("bf16", "fp8"),
    "fast": ("aot", "turbo"),
    "decode": ("gpu", "tpu"),
    "classes": ("0,2", "1,,2"),
    "max_det": (100, 0),
    "opset": (13, 5),
    "tracker": ("botsort", None),
}


def cli_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "auto"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def samples(info: OptionInfo, tmp_path) -> tuple[Any, Any]:
    """(valid, invalid) values of one option; invalid None when it takes any text."""
    if info.name == "resume":
        last = tmp_path / "last.pt"
        last.write_bytes(b"")
        return str(last), "flase"
    check: Check = info.check
    if info.name in SAMPLES and not (check.choices or check.bounds or check.text == "true or false"):
        return SAMPLES[info.name]
    if check.text == "true or false":
        return (not info.default) if isinstance(info.default, bool) else True, "maybe"
    if check.choices:
        return check.choices[-1], "nope"
    if check.bounds is not None:
        valid = info.default if info.default is not None else 1
        low, high = check.bounds
        integer = check.text.startswith("integer")
        if low is not None:
            return valid, int(low) - 1 if integer else low - 1
        if high is not None:
            return valid, int(high) + 1 if integer else high + 1
        return valid, "abc"
    pytest.fail(f"no sample values for option {info.name!r} ({check!r}): add it to SAMPLES")


def options_of(kind: str) -> list[tuple[str, OptionInfo]]:
    """(task, option) pairs of a command: task None for what every task takes."""
    if kind == "train":
        out = [(None, i) for g in C.GROUPS.values() for i in option_fields(g) if i.meta.get("cli", True)]
        out += [(t, i) for t in TASKS for i in option_fields(TASKS[t].Options)]
        return out
    cls = {"predict": CO.PredictOptions, "val": CO.ValOptions, "export": CO.ExportOptions}[kind]
    return [((i.meta.get("tasks") or (None,))[0], i) for i in option_fields(cls) if i.meta.get("cli", True)]


CASES = [(kind, task, info.name) for kind in ("train", "predict", "val", "export") for task, info in options_of(kind)]


class Accepted(Exception):
    """Raised by the fake model's train/predict/val/export with the keywords the CLI passed."""

    def __init__(self, kwargs):
        super().__init__("accepted")
        self.kwargs = kwargs


class FakeModel:
    FAMILY, size, names, nc, trained = "fake", "t", {0: "a", 1: "b", 2: "c"}, 3, True

    def __init__(self, task: str):
        self.task_def, self.task, self.TASK = get_task(task), task, task

    def train(self, **kw):
        raise Accepted(kw)

    def predict(self, source, **kw):
        raise Accepted(kw)

    def val(self, **kw):
        raise Accepted(kw)

    def export(self, **kw):
        raise Accepted(kw)


def run_cli(kind: str, task: str | None, name: str, text: str, monkeypatch, capsys) -> tuple[int | None, Any]:
    """(exit status, None) when the CLI refused; (None, the keywords the API got) when it accepted."""
    task = task or "detect"
    monkeypatch.setattr(cli, "_load", lambda opts, seed=None: FakeModel(task))
    argv = [kind, f"model={MODEL_OF[task]}" if kind == "train" else "model=x.pt", f"{name}={text}"]
    if kind in ("train", "val") and name != "data":
        argv.append("data=shapes")
    capsys.readouterr()
    try:
        rc = cli.main(argv)
    except Accepted as acc:
        return None, acc.kwargs
    return rc, capsys.readouterr().err


def api_check(kind: str, task: str | None, name: str, value: Any) -> Any:
    """The value as the API keeps it, or the OptionError/ValueError it raises: train through
    TrainConfig and the trainer's check_config (what model.train runs before anything else),
    predict through PredictOptions.build (what Predictor.__call__ runs first)."""
    if kind == "train":
        from libreyolo.engine.trainer import check_config
        cfg = C.TrainConfig(task or "detect", **{name: value})
        check_config(cfg, 1)
        return getattr(cfg, name)
    if kind == "predict":
        _, task_opts = CO.PredictOptions.build(get_task(task or "detect"), {name: value})
        opts, _ = CO.PredictOptions.build(get_task(task or "detect"), {name: value})
        return task_opts.get(name, getattr(opts, name))
    cls = CO.ValOptions if kind == "val" else CO.ExportOptions
    o = cls(**{name: value})
    from libreyolo.options import check_fields
    check_fields(o)
    return getattr(o, name)


@pytest.mark.parametrize("kind, task, name", CASES, ids=[f"{k}-{t or 'all'}-{n}" for k, t, n in CASES])
def test_cli_and_api_agree(kind, task, name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    info = {i.name: i for t, i in options_of(kind) if t == task}[name]
    valid, invalid = samples(info, tmp_path)
    # a valid value: accepted by both, and the API gets the same value either way
    rc, got = run_cli(kind, task, name, cli_text(valid), monkeypatch, capsys)
    assert rc is None, f"the CLI refused {name}={cli_text(valid)}: {got}"
    assert name in got, f"{name} given on the command line did not reach the API: {got}"
    if task == "segment-prompt" and name in ("points", "labels", "boxes"):
        return   # the prompt's text is the CLI's own form (x,y;x,y), parsed into the API's lists
    if name == "classes":   # the CLI resolves ids and names against the model's names at once
        from libreyolo.options import parse_classes
        assert got[name] == parse_classes(valid, FakeModel.names)
    else:
        assert api_check(kind, task, name, got[name]) == api_check(kind, task, name, valid)
    if invalid is None:
        return
    # an invalid value: refused by both, with the same message
    with pytest.raises(ValueError) as api_err:
        api_check(kind, task, name, invalid)
    rc, err = run_cli(kind, task, name, cli_text(invalid), monkeypatch, capsys)
    assert rc == 2, f"the CLI accepted {name}={cli_text(invalid)}"
    api_message = str(api_err.value)
    tail = f"got {invalid!r}"
    if api_message.endswith(tail):   # the value as given: a number in Python, its text on the command line
        api_message = api_message[:-len(tail)] + f"got {cli_text(invalid)!r}"
    assert api_message in err, (err, api_message)


def test_every_option_of_the_api_is_on_the_command_line():
    """Each field of the training groups, each task's Options and predict/val/export's options
    is an option of its command (train --help lists every option of model.train())."""
    for kind, spec in (("train", cli.TRAIN), ("predict", cli.PREDICT), ("val", cli.VAL), ("export", cli.EXPORT)):
        for _, info in options_of(kind):
            assert info.name in spec, (kind, info.name)
    assert set(cli.TRACK) == set(cli.PREDICT) | {"tracker", "frame", "obj_id"}   # frame, obj_id: SAM 2 video


def test_every_option_has_help_and_a_check():
    for kind in ("train", "predict", "val", "export"):
        for _, info in options_of(kind):
            assert info.help and info.check is not None, (kind, info.name)


def test_the_api_refuses_through_the_same_checks():
    """The entry points themselves (not only the checks they call) refuse with these messages."""
    from libreyolo import LibreYOLO
    m = LibreYOLO.new("yolo9", "t", device="cpu")
    with pytest.raises(OptionError, match=r"momentum must be a number in \[0, 1\), got 1.5"):
        m.train(data="shapes", momentum=1.5)
    with pytest.raises(OptionError, match=r"hsv_h must be a number in \[0, 1\], got 2"):
        m.train(data="shapes", hsv_h=2)
    with pytest.raises(OptionError, match=r"timeout must be a number > 0, got 0"):
        m.predict(None, timeout=0)
    with pytest.raises(OptionError, match="strict must be true or false"):
        m.predict(None, strict="maybe")
    with pytest.raises(OptionError, match=r"opset must be an integer >= 11, got 5"):
        m.export(opset=5)
    with pytest.raises(OptionError, match=r"label_smoothing must be a number in \[0, 1\), got 1"):
        C.TrainConfig("classify", label_smoothing=1)


def test_task_predict_defaults_are_the_declared_ones():
    """A task's own predict options default, in the task, to what PredictOptions declares (what
    --help and docs/options.md show)."""
    declared = {i.name: i for i in option_fields(CO.PredictOptions) if i.meta.get("tasks")}
    for name in TASKS:
        task = TASKS[name]
        for key, default in task.predict_defaults.items():
            assert key in declared and name in declared[key].meta["tasks"], (name, key)
            assert declared[key].default == default, (name, key)


def test_train_without_data_is_refused_listing_the_built_in_sets(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_load", lambda *a, **k: pytest.fail("a model was loaded without data"))
    assert cli.main(["train", "epochs=1"]) == 2
    err = capsys.readouterr().err
    assert "data is required" in err and "'shapes'" in err
    assert cli.main(["train", "model=resnet18"]) == 2
    assert "'shapes-cls'" in capsys.readouterr().err
    assert C.RunConfig().data is None


def test_a_task_option_of_another_task_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_load", lambda *a, **k: pytest.fail("a model was loaded despite a bad option"))
    assert cli.main(["train", "model=resnet18", "data=shapes-cls", "mosaic=0.5"]) == 2
    assert "mosaic is a training option of detect models, not of classify models" in capsys.readouterr().err
    # scale is both detection's (< 1) and classification's (<= 1): checked as the model's task takes it
    assert cli.main(["train", "model=yolo9t", "data=shapes", "scale=1"]) == 2
    assert "scale must be a number in [0, 1), got '1'" in capsys.readouterr().err


def test_predict_strict_reaches_the_api(monkeypatch):
    monkeypatch.setattr(cli, "_load", lambda opts, seed=None: FakeModel("detect"))
    with pytest.raises(Accepted) as acc:
        cli.main(["predict", "model=x.pt", "source=imgs", "strict=true"])
    assert acc.value.kwargs["strict"] is True
    # the predictors outside the engine's take it too
    import inspect

    from libreyolo.export.onnx_model import OnnxModel
    from libreyolo.tasks.segment_prompt.predictor import PromptPredictor
    for fn in (OnnxModel.predict, PromptPredictor.__call__):
        assert "strict" in inspect.signature(fn).parameters


def test_docs_options_table_is_up_to_date():
    from pathlib import Path

    from libreyolo.cli import options_markdown
    path = Path(__file__).resolve().parents[2] / "docs" / "options.md"
    assert path.read_text() == options_markdown(), \
        "docs/options.md is out of date: python scripts/options_doc.py"


@pytest.mark.parametrize("name, bad", [("batch", 0), ("workers", -1), ("save_json", "maybe"), ("verbose", "maybe"),
                                       ("imgsz", 0), ("conf", 5), ("iou", -0.1)])
def test_model_val_refuses_as_the_cli_does(name, bad):
    from libreyolo import LibreYOLO
    from libreyolo.options import check_fields
    m = LibreYOLO.new("yolo9", "t", device="cpu")
    with pytest.raises(ValueError) as cli_side:
        check_fields(CO.ValOptions(**{name: bad}))
    with pytest.raises(ValueError) as api_side:
        m.val(data="no-such-dataset.yaml", **{name: bad})
    assert str(api_side.value) == str(cli_side.value)
