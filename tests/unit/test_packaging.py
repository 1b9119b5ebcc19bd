"""Packaging habits: one version string, typing marker shipped, one OpenCV distribution in the extras."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import tomllib

import libreyolo

ROOT = Path(__file__).resolve().parents[2]


def test_one_version_string():
    """pyproject.toml takes the version from libreyolo.__version__ (no second literal), and an
    installed package's metadata says the same."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "libreyolo.__version__"}
    try:
        installed = importlib.metadata.version(project["project"]["name"])
    except importlib.metadata.PackageNotFoundError:   # run from a checkout that is not installed
        return
    assert installed == libreyolo.__version__


def test_the_distribution_has_a_name_of_its_own():
    """The import name is libreyolo; the distribution is not called libreyolo (that name on PyPI
    is the LibreYOLO project's, whose users this library is for), and the README says so."""
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert name != "libreyolo" and name.startswith("libreyolo-")
    assert f"`{name}`" in (ROOT / "README.md").read_text()


def test_typed_marker_is_package_data():
    """PEP 561: libreyolo/py.typed exists and is listed as package data, so wheels carry it."""
    assert (ROOT / "libreyolo" / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["libreyolo"]


def test_extras_name_one_opencv_package():
    """``pip install ".[all]"`` installs one OpenCV distribution: two (opencv-python and
    opencv-python-headless) would write into one ``cv2`` package, each over the other."""
    import re
    from importlib.metadata import PackageNotFoundError, requires
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ours = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for reqs in extras.values() for r in reqs
            if r.lower().startswith("opencv")}
    try:   # what the extras' own dependencies bring (where they are installed)
        theirs = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requires("trackers") or []
                  if r.lower().startswith("opencv")}
    except PackageNotFoundError:
        theirs = set()
    assert len(ours | theirs) == 1, sorted(ours | theirs)
