"""Run folders and output file names shared by predict and train."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def task_project(task: str) -> Path:
    """Where a task's runs go unless told: ``runs/<task>`` (``runs/detect``), whose folders are
    named after the mode - ``train``, ``val``, ``predict``, ``track`` - and numbered (``train2``)."""
    return Path("runs") / task


def next_run_dir(project: str | Path, name: str, exist_ok: bool = False) -> Path:
    """``project/name``, or with ``exist_ok=False`` and that folder present the first free
    ``project/name2``, ``name3``, ... (as training runs are numbered)."""
    base = Path(project) / name
    if exist_ok or not base.exists():
        return base
    i = 2
    while (Path(project) / f"{name}{i}").exists():
        i += 1
    return Path(project) / f"{name}{i}"


class UniqueNames:
    """Output file names that never collide within one call: ``a.jpg``, then ``a_2.jpg``, ... for
    inputs with the same stem (``x/a.png`` and ``y/a.png``)."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def __call__(self, stem: str, suffix: str = ".jpg") -> str:
        stem = stem or "image"
        name, i = f"{stem}{suffix}", 2
        while name in self._used:
            name, i = f"{stem}_{i}{suffix}", i + 1
        self._used.add(name)
        return name


def save_folder(output_path: str | os.PathLike) -> Path:
    """Where predict's pictures go for ``output_path`` (LibreYOLO 1.6.0's option): the path itself
    when it has no suffix (a folder), else its parent (the path names the first picture's file)."""
    path = Path(output_path)
    return path.parent if path.suffix else path


def save_name(output_path: Any, output_file_format: str | None, result: Any) -> tuple[str, str]:
    """(stem, suffix) of a predicted picture's file: ``output_path``'s own name when it names a
    file, else the input's stem; the suffix ``output_file_format``'s, else the result's own
    (``.jpg``, a matte's ``.png``)."""
    suffix = f".{output_file_format}" if output_file_format else result.save_suffix
    if output_path is not None and Path(output_path).suffix:
        return Path(output_path).stem, Path(output_path).suffix
    return Path(result.path).stem, suffix
