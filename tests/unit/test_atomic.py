"""libreyolo.atomic: a file written through a temp file, and a failed write named by its target."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import atomic
from libreyolo.atomic import FileWriteError, atomic_write


def test_writes_the_target_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.bin"
    with atomic_write(target) as f:
        f.write(b"abc")
    assert target.read_bytes() == b"abc"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]


def test_an_error_in_the_block_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"), atomic_write(target) as f:
        f.write(b"half")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old" and list(tmp_path.iterdir()) == [target]


def test_read_only_folder_names_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.png"

    def read_only(path, mode="r", *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(atomic, "open", read_only, raising=False)
    with pytest.raises(FileWriteError) as info, atomic_write(target, what="save"):
        pass
    text = str(info.value)
    assert text.startswith(f"cannot save '{target}': [Errno 30] Read-only file system")
    assert "read-only filesystem" in text and ".tmp" not in text and f"nothing was written at '{target}'" in text
    assert info.value.errno == errno.EROFS and info.value.filename == str(target)
    assert isinstance(info.value, OSError)


def test_full_disk_names_the_target_and_the_free_space(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(FileWriteError) as info, atomic_write(target) as f:
        f.write(b"new")
        raise OSError(errno.ENOSPC, "No space left on device")
    text = str(info.value)
    assert f"cannot write '{target}'" in text and "free on the filesystem of" in text and "disk is full" in text
    assert f"the previous '{target}' is intact" in text
    assert target.read_bytes() == b"old" and list(tmp_path.iterdir()) == [target]


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_results_save_on_a_full_disk_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's last step (saving the annotated picture) on a full disk said only
    '[Errno 28] No space left on device'."""
    from libreyolo.results import Results
    r = Results(np.zeros((20, 30, 3), np.uint8), "x.png", {0: "a"})
    monkeypatch.setattr(Image.Image, "save", _no_space)
    target = tmp_path / "prediction.jpg"
    with pytest.raises(OSError) as info:
        r.save(target)
    assert str(target) in str(info.value) and "disk is full" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_depth_map_save_on_a_full_disk_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from libreyolo.tasks.depth.results import DepthMap
    d = DepthMap(torch.rand(8, 8))
    monkeypatch.setattr(np, "save", _no_space)
    target = tmp_path / "d.npy"
    with pytest.raises(OSError) as info:
        d.save(target)
    assert str(target) in str(info.value) and "disk is full" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_export_write_on_a_full_disk_names_the_file_and_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from libreyolo.export.onnx import _write_atomic
    monkeypatch.setattr(os, "fsync", _no_space)
    target = tmp_path / "m.onnx"
    with pytest.raises(OSError) as info:
        _write_atomic(b"x" * 4096, target)
    text = str(info.value)
    assert f"cannot export '{target}'" in text and "it needs about 4.0 KiB" in text and "disk is full" in text
    assert info.value.errno == errno.ENOSPC and list(tmp_path.iterdir()) == []
