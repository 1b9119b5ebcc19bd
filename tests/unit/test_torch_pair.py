"""A torch/torchvision pair that does not work together fails at once with one message naming both
versions and how to reinstall them; ``libreyolo info`` reports it (and fits 80 columns)."""
from __future__ import annotations

import importlib.abc
import io
import sys

import pytest
import torch
from rich.console import Console

from libreyolo import cli, device


class _Broken(importlib.abc.MetaPathFinder):
    """torchvision's import failing as it does against another torch's build."""

    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            raise RuntimeError("operator torchvision::nms does not exist")


@pytest.fixture
def broken(monkeypatch):
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Broken(), *sys.meta_path])
    monkeypatch.setattr(device, "_PAIR", {})
    monkeypatch.setattr(device, "_dist_version", lambda pkg: "0.99.0")


def test_pair_problem_names_both_versions(broken):
    problem = device.torch_pair_problem()
    assert problem.startswith(f"torch {torch.__version__} and torchvision 0.99.0 do not work together "
                              "(operator torchvision::nms does not exist)")
    minor = int(torch.__version__.split(".")[1])
    assert f'pip install --force-reinstall "torch=={torch.__version__.split("+")[0]} torchvision==0.{minor + 15}.*"' \
        in problem
    with pytest.raises(RuntimeError, match="do not work together"):
        device.require_torch_pair()


def test_pair_ok_here(monkeypatch):
    monkeypatch.setattr(device, "_PAIR", {})
    assert device.torch_pair_problem() is None


def test_train_and_val_fail_at_once(monkeypatch, tmp_path):
    from libreyolo import LibreYOLO
    monkeypatch.setattr(device, "_PAIR", {"problem": "torch X and torchvision Y do not work together"})
    model = LibreYOLO("yoloxn", device="cpu")
    with pytest.raises(RuntimeError, match="torch X and torchvision Y"):
        model.train(data="shapes", epochs=1, imgsz=64, batch=2, project=str(tmp_path))
    assert not list(tmp_path.rglob("*.pt"))   # nothing trained
    with pytest.raises(RuntimeError, match="torch X and torchvision Y"):
        model.val(data="shapes", imgsz=64)


def _info(monkeypatch, width: int = 80) -> tuple[int, str]:
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=width, soft_wrap=True, color_system=None))
    rc = cli.cmd_info({"json": False})
    return rc, out.getvalue()


def test_info_reports_a_broken_pair(monkeypatch, capsys):
    monkeypatch.setattr(device, "_PAIR", {"problem": "torch X and torchvision Y do not work together"})
    rc, text = _info(monkeypatch)
    assert rc == 1
    assert "error: torch X and torchvision Y do not work together" in text and "torchvision" in text
    assert cli.cmd_info({"json": True}) == 1
    assert '"problem": "torch X and torchvision Y do not work together"' in capsys.readouterr().out


def test_info_fits_80_columns(monkeypatch):
    rc, text = _info(monkeypatch, 80)
    assert rc == 0 and "detect: " in text and "  yolo9: sizes t, s, m, c" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    rc, wide = _info(monkeypatch, 200)
    assert rc == 0 and "checkpoint names" in wide   # a wide terminal: the table
