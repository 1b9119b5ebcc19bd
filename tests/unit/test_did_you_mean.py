"""An unknown option or command gets a "did you mean" naming the closest known one."""
from __future__ import annotations

import numpy as np
import pytest

from libreyolo.cli import main
from libreyolo.engine.config import TrainConfig
from libreyolo.options import did_you_mean


def test_did_you_mean():
    assert did_you_mean(["epoch"], ["epochs", "batch"]) == " (did you mean 'epochs'?)"
    assert did_you_mean(["epoch", "bach"], ["epochs", "batch"]) == " (did you mean 'epochs' for 'epoch', 'batch' for 'bach'?)"
    assert did_you_mean(["zzz"], ["epochs", "batch"]) == ""


def test_cli_unknown_command_and_option(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian' (did you mean 'train'?)" in capsys.readouterr().err
    assert main(["train", "epoch=3"]) == 2
    assert "unknown option 'epoch' for 'train' (did you mean 'epochs'?)" in capsys.readouterr().err


def test_python_unknown_options():
    with pytest.raises(TypeError, match=r"unknown training option\(s\): epoch \(did you mean 'epochs'\?\)"):
        TrainConfig("detect", epoch=3)
    from libreyolo import LibreYOLO
    model = LibreYOLO.new("yolox", "n", device="cpu")
    with pytest.raises(TypeError, match=r"unknown predict option\(s\) cnf for a detect model \(did you mean 'conf'\?\)"):
        model.predict(np.zeros((32, 32, 3), np.uint8), imgsz=64, cnf=0.5)
