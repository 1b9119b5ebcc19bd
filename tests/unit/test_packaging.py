"""Packaging habits: one version string, typing marker shipped."""
from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import libreyolo

ROOT = Path(__file__).resolve().parents[2]


def test_one_version_string():
    """pyproject.toml takes the version from libreyolo.__version__ (no second literal), and an
    installed package's metadata says the same."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "libreyolo.__version__"}
    try:
        installed = importlib.metadata.version("libreyolo")
    except importlib.metadata.PackageNotFoundError:   # run from a checkout that is not installed
        return
    assert installed == libreyolo.__version__


def test_typed_marker_is_package_data():
    """PEP 561: libreyolo/py.typed exists and is listed as package data, so wheels carry it."""
    assert (ROOT / "libreyolo" / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["libreyolo"]
