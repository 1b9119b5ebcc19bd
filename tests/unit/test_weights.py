"""Tests for libreyolo.weights: checkpoint round trips, atomic saves, load errors, weight resolution.

Nothing here touches the internet: an autouse fixture turns downloads off and points the cache at a
temp dir, and the one download test talks to a small Hugging Face hub stand-in on 127.0.0.1.
"""

from __future__ import annotations

import errno
import hashlib
import http.server
import io
import os
import pickle
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
import torch

from libreyolo import weights as W

NAMES = {0: "person", 1: "bicycle", 2: "car", 10: "fire hydrant"}


def make_ckpt() -> dict:
    """A small LibreYOLO-format checkpoint with awkward tensors (views, NaN, -0.0, many dtypes).
    Its NaN and inf weights round-trip bit for bit; loading it needs ``check_finite=False``."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1e-45])
    sd = {
        "backbone.conv.weight": torch.randn(8, 3, 3, 3, generator=g),
        "backbone.bn.running_mean": torch.randn(8, generator=g),
        "backbone.bn.num_batches_tracked": torch.tensor(7, dtype=torch.int64),
        "head.transposed": base.t(),  # non-contiguous
        "head.view_a": base[1:3],  # shares storage with head.view_b
        "head.view_b": base[2:],
        "head.special": special,
        "head.half": torch.randn(5, generator=g).half(),
        "head.bf16": torch.randn(5, generator=g).bfloat16(),
        "head.mask": torch.tensor([True, False, True]),
        "head.uint8": torch.arange(10, dtype=torch.uint8),
        "a.first_in_order_but_last_alphabetically": torch.zeros(2),
    }
    return {
        "model": sd,
        "model_family": "yolo9",
        "size": "t",
        "task": "detect",
        "nc": 80,
        "names": dict(NAMES),
        "imgsz": 640,
        "schema_version": "1.0",
        "libreyolo_version": "0.1.0",
    }


def bits(t: torch.Tensor) -> bytes:
    """Raw bytes of a tensor's values, for bitwise comparison (NaN and -0.0 included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_state(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        assert bits(a[key]) == bits(b[key]), key


class Custom:
    """An arbitrary class: weights_only loading must refuse to rebuild it."""

    def __init__(self) -> None:
        self.value = 3


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Private weights cache, downloads off by default, no repo override from the environment."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_DIR", str(cache))
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "1")
    monkeypatch.delenv("LIBREYOLO_HF_REPO", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".safetensors"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    ckpt = make_ckpt()
    target = tmp_path / "sub" / "dir" / f"LibreYOLO9t{suffix}"
    out = W.save_checkpoint(ckpt, target)
    assert out == target and target.is_file()

    loaded = W.load_checkpoint(target, check_finite=False)
    assert_same_state(ckpt["model"], loaded["model"])
    for key, value in ckpt.items():
        if key != "model":
            assert loaded[key] == value, key
    assert set(loaded) == set(ckpt)
    assert all(isinstance(k, int) for k in loaded["names"])
    assert loaded["names"] == NAMES
    # Nothing but the target is left in the directory.
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


def test_round_trip_fixture_checkpoint(tmp_path: Path) -> None:
    """A realistic state dict (the yolo9-t layout) survives safetensors bitwise and in order."""
    sd = {f"layer{i}.weight": torch.randn(3, i + 1) for i in range(50)}
    sd["layer0.bn.num_batches_tracked"] = torch.tensor(0)
    target = W.save_checkpoint({"model": sd, "names": {}}, tmp_path / "m.safetensors")
    loaded = W.load_checkpoint(target)
    assert_same_state(sd, loaded["model"])
    assert loaded["names"] == {}


def test_bare_state_dict_is_wrapped(tmp_path: Path) -> None:
    sd = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    torch.save(sd, tmp_path / "bare.pt")
    loaded = W.load_checkpoint(tmp_path / "bare.pt")
    assert set(loaded) == {"model"}
    assert_same_state(sd, loaded["model"])


def test_state_dict_key_is_normalised(tmp_path: Path) -> None:
    sd = {"w": torch.ones(3)}
    torch.save({"state_dict": sd, "nc": 3}, tmp_path / "alt.pt")
    loaded = W.load_checkpoint(tmp_path / "alt.pt")
    assert "state_dict" not in loaded and loaded["nc"] == 3
    assert_same_state(sd, loaded["model"])


def test_plain_safetensors_without_metadata(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"x": torch.ones(2, 2)}, str(tmp_path / "plain.safetensors"))
    loaded = W.load_checkpoint(tmp_path / "plain.safetensors")
    assert set(loaded) == {"model"} and torch.equal(loaded["model"]["x"], torch.ones(2, 2))


def test_safetensors_refuses_non_json_fields(tmp_path: Path) -> None:
    ckpt = {"model": {"w": torch.ones(1)}, "optimizer": {"state": torch.zeros(1)}}
    with pytest.raises(ValueError, match="optimizer"):
        W.save_checkpoint(ckpt, tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Atomic save
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_failed_save_leaves_old_target_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc_type: type[BaseException]
) -> None:
    target = tmp_path / "LibreYOLO9t.pt"
    W.save_checkpoint(make_ckpt(), target)
    before = target.read_bytes()

    real_save = torch.save

    def exploding_save(obj, f, *args, **kwargs):
        f.write(b"partial bytes that must never reach the target")
        real_save({"half": torch.zeros(3)}, io.BytesIO())  # do some real work first
        raise exc_type("disk on fire")

    monkeypatch.setattr(torch, "save", exploding_save)
    new = make_ckpt()
    new["nc"] = 3
    with pytest.raises(exc_type, match="disk on fire"):
        W.save_checkpoint(new, target)

    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    assert W.load_checkpoint(target, check_finite=False)["nc"] == 80


def test_failed_replace_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "w.safetensors"
    W.save_checkpoint(make_ckpt(), target)
    before = target.read_bytes()

    def broken_replace(src, dst):
        raise OSError("replace failed")

    monkeypatch.setattr(W.os, "replace", broken_replace)
    with pytest.raises(OSError, match="replace failed"):
        W.save_checkpoint({"model": {"w": torch.ones(1)}}, target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_save_keeps_existing_mode(tmp_path: Path) -> None:
    target = tmp_path / "w.pt"
    W.save_checkpoint({"model": {"w": torch.ones(1)}}, target)
    assert target.stat().st_mode & 0o777 == 0o666 & ~W._umask()  # not the temp file's private 0600
    target.chmod(0o640)
    W.save_checkpoint({"model": {"w": torch.zeros(1)}}, target)
    assert target.stat().st_mode & 0o777 == 0o640


def torch_full_disk(limit: int):
    """A torch.save whose file object accepts ``limit`` bytes and then fails like a full disk:
    the OSError(ENOSPC) of the write surfaces from torch's zip writer as its RuntimeError."""
    real_save = torch.save

    class Full(io.RawIOBase):
        def __init__(self, f):
            self.f, self.n = f, 0

        def writable(self):
            return True

        def write(self, b):
            if self.n + len(b) > limit:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.n += len(b)
            return self.f.write(b)

    def save(obj, f, *args, **kwargs):
        return real_save(obj, Full(f), *args, **kwargs)

    return save


def test_full_disk_during_torch_save_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "last.pt"
    W.save_checkpoint(make_ckpt(), target)
    before = target.read_bytes()
    monkeypatch.setattr(torch, "save", torch_full_disk(600))
    big = {"model": {"w": torch.zeros(1000, 256)}, "optimizer": {"m": torch.zeros(1000, 256)}}
    with pytest.raises(W.CheckpointSaveError) as info:
        W.save_checkpoint(big, target)
    err = info.value
    msg = str(err)
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename == str(target)
    assert msg.startswith(f"cannot save checkpoint '{target}': OSError: [Errno 28] No space left on device")
    assert "it needs about 2.0 MiB" in msg  # two float32 tensors of 1 MiB each
    assert " free on the filesystem of " in msg and "(the disk is full)" in msg
    assert f"the previous '{target}' is intact" in msg and "free some space or save elsewhere" in msg
    assert isinstance(err.__cause__, (OSError, RuntimeError))  # where the write failed decides which
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_torch_zip_writer_error_names_file_need_and_free_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error as reported (torch's message, no path): wrapped, with the OSError behind it if any."""
    target = tmp_path / "w.pt"
    monkeypatch.setattr(torch, "save", torch_full_disk(600))  # fails inside torch's zip writer
    with pytest.raises(W.CheckpointSaveError) as info:
        W.save_checkpoint({"model": {"w": torch.zeros(1000, 256)}}, target)
    assert str(info.value).startswith(
        f"cannot save checkpoint '{target}': OSError: [Errno 28] No space left on device (torch: RuntimeError: "
        "[enforce fail at inline_container.cc")
    assert "unexpected pos" in str(info.value) and info.value.errno == errno.ENOSPC

    def enforce_fail(obj, f, *a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 577 vs 530")

    monkeypatch.setattr(torch, "save", enforce_fail)
    monkeypatch.setattr(W.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(W.CheckpointSaveError) as info:
        W.save_checkpoint({"model": {"w": torch.zeros(1000)}}, target)
    msg = str(info.value)
    assert msg == (f"cannot save checkpoint '{target}': RuntimeError: [enforce fail at inline_container.cc:672] . "
                   f"unexpected pos 577 vs 530; it needs about 3.9 KiB; 1000 B free on the filesystem of "
                   f"'{tmp_path}' (the disk is full); nothing was written at '{target}' and no temp file was "
                   "left behind: free some space or save elsewhere")
    assert info.value.errno == errno.ENOSPC


def test_full_disk_without_an_old_file_says_nothing_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "save", torch_full_disk(0))
    target = tmp_path / "best.pt"
    with pytest.raises(W.CheckpointSaveError, match=f"nothing was written at '{target}'"):
        W.save_checkpoint({"model": {"w": torch.zeros(10)}}, target)
    assert list(tmp_path.iterdir()) == []


def test_enospc_while_writing_safetensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "w.safetensors"
    real_write = tempfile._TemporaryFileWrapper.__getattr__

    def no_space(self, name):
        if name == "write":
            def write(b):
                raise OSError(errno.ENOSPC, "No space left on device")
            return write
        return real_write(self, name)

    monkeypatch.setattr(tempfile._TemporaryFileWrapper, "__getattr__", no_space)
    ckpt = {"model": {"w": torch.zeros(64, 64)}, "nc": 3}
    expected = len(W._safetensors_bytes(ckpt, target))
    with pytest.raises(W.CheckpointSaveError) as info:
        W.save_checkpoint(ckpt, target)
    assert f"it needs about {expected / 1024:.1f} KiB" in str(info.value)
    assert info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_other_torch_errors_are_not_disguised_as_disk_errors(tmp_path: Path) -> None:
    with pytest.raises(Exception) as info:
        W.save_checkpoint({"model": {"w": torch.zeros(1)}, "fn": lambda: 0}, tmp_path / "x.pt")
    assert not isinstance(info.value, W.CheckpointSaveError)
    assert list(tmp_path.iterdir()) == []


def test_stale_temp_files_of_the_target_are_removed_on_the_next_save(tmp_path: Path) -> None:
    target = tmp_path / "last.pt"
    stale = [tmp_path / ".last.pt.ab3d_f9z.tmp", tmp_path / ".last.pt.00000000.tmp"]
    fresh = tmp_path / ".last.pt.freshone.tmp"          # a save in progress elsewhere: too young
    other = [tmp_path / ".best.pt.ab3d_f9z.tmp",          # another target's
             tmp_path / ".last.pt.bak.ab3d_f9z.tmp",      # the temp of a target named 'last.pt.bak'
             tmp_path / ".last.pt.toolongname.tmp",       # not a temp-file name
             tmp_path / "last.pt.ab3d_f9z.tmp"]           # not hidden: not ours
    old = time.time() - 2 * W.STALE_TEMP_AGE_S
    for p in [*stale, fresh, *other]:
        p.write_bytes(b"partial")
        if p is not fresh:
            os.utime(p, (old, old))
    W.save_checkpoint({"model": {"w": torch.ones(1)}}, target)
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {target.name, fresh.name, *(p.name for p in other)}


@pytest.mark.skipif(W._fcntl is None, reason="advisory file locks are POSIX-only")
def test_temp_of_a_dead_writer_is_removed_at_once_and_a_locked_one_is_kept(tmp_path: Path) -> None:
    """A save locks its temp file while writing; one nobody holds a lock on, past the grace, was
    left by a writer that died (kill -9) and goes on the next save even if it is seconds old. A
    locked one (a save in progress in another process) stays, however old."""
    import fcntl
    target = tmp_path / "last.pt"
    dead, busy = tmp_path / ".last.pt.deadbeef.tmp", tmp_path / ".last.pt.busy0000.tmp"
    recent = time.time() - 3 * W.STALE_TEMP_GRACE_S       # far younger than STALE_TEMP_AGE_S
    for p in (dead, busy):
        p.write_bytes(b"partial")
        os.utime(p, (0 if p is busy else recent, 0 if p is busy else recent))
    with busy.open("rb") as held:                           # another open file: its lock conflicts
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        W.save_checkpoint({"model": {"w": torch.ones(1)}}, target)
        assert {p.name for p in tmp_path.iterdir()} == {target.name, busy.name}
    W.save_checkpoint({"model": {"w": torch.ones(2)}}, target)   # its writer has finished now
    assert {p.name for p in tmp_path.iterdir()} == {target.name}


def test_stale_temp_cleanup_frees_space_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cleanup runs before the temp file is created: on a full disk it is what makes room."""
    stale = tmp_path / ".w.pt.zzzzzzzz.tmp"
    stale.write_bytes(b"x")
    os.utime(stale, (0, 0))
    order = []
    real_ntf = tempfile.NamedTemporaryFile
    monkeypatch.setattr(W.tempfile, "NamedTemporaryFile",
                        lambda *a, **k: order.append(stale.exists()) or real_ntf(*a, **k))
    W.save_checkpoint({"model": {"w": torch.ones(1)}}, tmp_path / "w.pt")
    assert order == [False]


# ---------------------------------------------------------------------------------------------
# Checkpoint metadata
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, wanted", [
    ("nc", "eighty", "a positive integer"),
    ("nc", 0, "a positive integer"),
    ("nc", True, "a positive integer"),
    ("nc", 2.0, "a positive integer"),
    ("imgsz", "640px", "a positive integer (pixels) or a square pair"),
    ("imgsz", -640, "a positive integer (pixels) or a square pair"),
    ("imgsz", [640, 480], "a positive integer (pixels) or a square pair"),
    ("names", "person,car", "a list of class names or a dict {class id: name} of strings"),
    ("names", [1, 2], "a list of class names or a dict {class id: name} of strings"),
    ("names", {0: "a", "x": "b"}, "a list of class names or a dict {class id: name} of strings"),
    ("names", {0: 5}, "a list of class names or a dict {class id: name} of strings"),
    ("size", 3, "a string"),
    ("model_family", ["yolo9"], "a string"),
    ("task", 1, "a string"),
])
def test_bad_metadata_is_named(tmp_path: Path, field: str, value: object, wanted: str) -> None:
    path = tmp_path / "bad.pt"
    ckpt = make_ckpt()
    ckpt[field] = value
    torch.save(ckpt, path)
    with pytest.raises(ValueError) as info:
        W.load_checkpoint(path)
    assert str(info.value).startswith(f"cannot load checkpoint '{path}': metadata field '{field}' must be "
                                      f"{wanted}, got {value!r} ({type(value).__name__})")


def test_metadata_accepted_forms(tmp_path: Path) -> None:
    path = tmp_path / "ok.pt"
    ckpt = make_ckpt()
    ckpt.update(imgsz=[320, 320], names=["a", "b"], size=None, task=None)
    torch.save(ckpt, path)
    loaded = W.load_checkpoint(path, check_finite=False)
    assert loaded["imgsz"] == 320 and loaded["names"] == ["a", "b"] and loaded["size"] is None
    ckpt["names"] = {"0": "a", "1": "b"}  # digit-string keys, as JSON would give
    torch.save(ckpt, path)
    assert W.load_checkpoint(path, check_finite=False)["names"] == {"0": "a", "1": "b"}


def test_bad_metadata_in_safetensors_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    ckpt = make_ckpt()
    ckpt["nc"] = "eighty"
    W.save_checkpoint(ckpt, path)  # saving does not judge metadata; loading names it
    with pytest.raises(ValueError, match="metadata field 'nc' must be a positive integer, got 'eighty'"):
        W.load_checkpoint(path)


# ---------------------------------------------------------------------------------------------
# Load errors
# ---------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        W.load_checkpoint(missing)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_corrupt_bytes(tmp_path: Path, suffix: str) -> None:
    bad = tmp_path / f"corrupt{suffix}"
    bad.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ValueError, match=r"cannot load checkpoint '.*corrupt"):
        W.load_checkpoint(bad)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_truncated_file(tmp_path: Path, suffix: str) -> None:
    good = W.save_checkpoint(make_ckpt(), tmp_path / f"good{suffix}")
    data = good.read_bytes()
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cannot load checkpoint '.*cut.*corrupt or truncated"):
        W.load_checkpoint(cut)


def test_pickle_with_custom_object_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.ones(1)}, "extra": Custom()}, evil)
    with pytest.raises(ValueError) as info:
        W.load_checkpoint(evil)
    message = str(info.value)
    assert "evil.pt" in message and "plain containers" in message
    assert "not allowed" in message and "Custom" in message


def test_raw_pickle_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "raw.pt"
    evil.write_bytes(pickle.dumps({"model": Custom()}, protocol=2))
    with pytest.raises(ValueError, match=r"raw\.pt.*not allowed"):
        W.load_checkpoint(evil)


@pytest.mark.parametrize(
    "payload",
    [
        {"model_family": "yolo9", "nc": 80, "names": {0: "a"}},
        {"model": {"w": [1, 2, 3]}},
        {"model": {}},
        [torch.ones(1)],
    ],
)
def test_no_state_dict(tmp_path: Path, payload: object) -> None:
    path = tmp_path / "meta_only.pt"
    torch.save(payload, path)
    with pytest.raises(ValueError, match="meta_only.pt"):
        W.load_checkpoint(path)


def test_directory_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "d.pt").mkdir()
    with pytest.raises(ValueError, match="directory"):
        W.load_checkpoint(tmp_path / "d.pt")


# ---------------------------------------------------------------------------------------------
# Locating weights (offline)
# ---------------------------------------------------------------------------------------------


def test_weights_dir(monkeypatch: pytest.MonkeyPatch, _isolated: Path) -> None:
    assert W.weights_dir() == _isolated
    monkeypatch.delenv("LIBREYOLO_WEIGHTS_DIR")
    assert W.weights_dir() == Path.home() / ".cache" / "libreyolo" / "weights"


def test_default_repo_naming() -> None:
    assert W.default_repo_for("LibreYOLO9t.pt") == "LibreYOLO/LibreYOLO9t"
    assert W.default_repo_for("/some/dir/LibreYOLOXs.pt") == "LibreYOLO/LibreYOLOXs"
    assert W.default_repo_for("LibreYOLO9c-seg.safetensors") == "LibreYOLO/LibreYOLO9c-seg"


def test_resolve_existing_path(tmp_path: Path) -> None:
    path = W.save_checkpoint(make_ckpt(), tmp_path / "mine.pt")
    assert W.resolve_weights(path) == path
    assert W.resolve_weights(str(path)) == path


def test_resolve_from_weights_dir(_isolated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cached = W.save_checkpoint(make_ckpt(), _isolated / "LibreYOLO9t.pt")
    monkeypatch.chdir(tmp_path)  # the bare name does not exist relative to the cwd
    assert W.resolve_weights("LibreYOLO9t.pt") == cached
    assert W.resolve_weights("elsewhere/LibreYOLO9t.pt") == cached


def test_resolve_offline_lists_every_place(_isolated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)

    def no_download(**kwargs):  # offline must not even try
        raise AssertionError("download attempted while offline")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", no_download)
    with pytest.raises(FileNotFoundError) as info:
        W.resolve_weights("LibreYOLO9t.pt")
    message = str(info.value)
    assert str(tmp_path / "LibreYOLO9t.pt") in message
    assert str(_isolated / "LibreYOLO9t.pt") in message
    assert "LibreYOLO/LibreYOLO9t" in message and "LIBREYOLO_OFFLINE=1" in message
    assert 'libreyolo.LibreYOLO.new("yolo9", "t")' in message
    assert "LIBREYOLO_HF_REPO" in message


@pytest.mark.parametrize(
    ("env", "download", "reason"),
    [
        ({"LIBREYOLO_OFFLINE": "true"}, None, "LIBREYOLO_OFFLINE=true"),
        ({"LIBREYOLO_OFFLINE": "0", "HF_HUB_OFFLINE": "1"}, None, "HF_HUB_OFFLINE=1"),
        ({"LIBREYOLO_OFFLINE": "0"}, False, "download=False"),
    ],
)
def test_download_not_allowed(
    monkeypatch: pytest.MonkeyPatch, env: dict, download: bool | None, reason: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    allowed, why = W.downloads_allowed(download)
    assert not allowed and reason in why
    with pytest.raises(FileNotFoundError, match=reason):
        W.resolve_weights("LibreYOLO9t.pt", download=download, repo_id="someone/else")


def test_downloads_allowed_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "0")
    assert W.downloads_allowed(None) == (True, "")
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "1")
    assert W.downloads_allowed(True) == (True, "")


# ---------------------------------------------------------------------------------------------
# A real download through huggingface_hub against a local hub stand-in
# ---------------------------------------------------------------------------------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serves ``/{repo_id}/resolve/{revision}/{filename}`` (HEAD and GET) like the hub does.

    Only what ``hf_hub_download`` needs: ``X-Repo-Commit``, an ``ETag``, ``Content-Length`` on
    success; a 404 with ``X-Error-Code`` when the repo or the file is unknown; ``fail_with`` set to a
    status code answers every request with it (a hub having trouble).
    """

    def __init__(self, files: dict[tuple[str, str], bytes]) -> None:
        self.files = files
        self.fail_with: int | None = None
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 5  # a stuck client cannot hold a server thread for long

            def log_message(self, *args: object) -> None:  # keep pytest output quiet
                pass

            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def do_GET(self) -> None:
                self._answer(send_body=True)

            def _answer(self, send_body: bool) -> None:
                hub.requests.append((self.command, self.path))
                if hub.fail_with is not None:
                    self.send_response(hub.fail_with)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = unquote(self.path.split("?", 1)[0])
                parts = path.lstrip("/").split("/")
                # org / repo / "resolve" / revision / filename
                if len(parts) == 5 and parts[2] == "resolve":
                    repo, filename = f"{parts[0]}/{parts[1]}", parts[4]
                    data = hub.files.get((repo, filename))
                    if data is not None:
                        self.send_response(200)
                        self.send_header("Content-Type", "application/octet-stream")
                        self.send_header("Content-Length", str(len(data)))
                        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                        self.send_header("X-Repo-Commit", COMMIT)
                        self.send_header("Accept-Ranges", "bytes")
                        self.end_headers()
                        if send_body:
                            self.wfile.write(data)
                        return
                    known_repo = any(r == repo for r, _ in hub.files)
                    code = "EntryNotFound" if known_repo else "RepoNotFound"
                else:
                    code = "RepoNotFound"
                body = b'{"error": "not found"}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", f"{code} (fake hub)")
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def _reset_hub_sessions() -> None:
    """Drop huggingface_hub's pooled HTTP client(s) so no connection outlives the fake server."""
    import huggingface_hub.utils as hf_utils

    for name in ("close_session", "reset_sessions"):  # 1.x/2.x, 0.2x
        fn = getattr(hf_utils, name, None)
        if callable(fn):
            fn()


def _point_hub_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str) -> None:
    """Point huggingface_hub (and libreyolo's hub check) at ``url``, downloads on, no proxies."""
    # Environment first (read by anything that imports huggingface_hub from now on) ...
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "5")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv(W.HUB_TIMEOUT_ENV, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "0")

    # ... then the values huggingface_hub already read at import time.
    from huggingface_hub import constants, file_download

    template = url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 5, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 5, raising=False)
    # 2.x asks the endpoint for an "agent harness" list once and caches it under HF_HOME.
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf_home" / "agents.json"), raising=False)
    # Older releases copied these names into file_download at import time.
    for name, value in (("ENDPOINT", url), ("HUGGINGFACE_CO_URL_TEMPLATE", template), ("HF_HUB_OFFLINE", False)):
        if hasattr(file_download, name):
            monkeypatch.setattr(file_download, name, value)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    """A local hub on 127.0.0.1 serving one checkpoint, with huggingface_hub pointed at it."""
    ckpt_path = W.save_checkpoint(make_ckpt(), tmp_path / "served" / "LibreYOLO9t.pt")
    files = {("LibreYOLO/LibreYOLO9t", "LibreYOLO9t.pt"): ckpt_path.read_bytes()}

    with FakeHub(files) as hub:
        _point_hub_at(monkeypatch, tmp_path, hub.url)
        _reset_hub_sessions()
        hub.served_ckpt = ckpt_path  # type: ignore[attr-defined]
        try:
            yield hub
        finally:
            _reset_hub_sessions()


def test_download_from_hub(fake_hub: FakeHub, _isolated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    got = W.resolve_weights("LibreYOLO9t.pt")
    assert got == _isolated / "LibreYOLO9t.pt"
    assert got.read_bytes() == fake_hub.served_ckpt.read_bytes()  # type: ignore[attr-defined]
    assert ("GET", "/LibreYOLO/LibreYOLO9t/resolve/main/LibreYOLO9t.pt") in fake_hub.requests

    loaded, served = W.load_checkpoint(got, check_finite=False), make_ckpt()
    assert_same_state(served["model"], loaded["model"])
    assert loaded["names"] == NAMES and loaded["model_family"] == "yolo9"

    # Second time it comes from the cache, with downloads off.
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "1")
    count = len(fake_hub.requests)
    assert W.resolve_weights("LibreYOLO9t.pt") == got
    assert len(fake_hub.requests) == count


def test_download_uses_repo_override(fake_hub: FakeHub, _isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = fake_hub.files[("LibreYOLO/LibreYOLO9t", "LibreYOLO9t.pt")]
    fake_hub.files[("myorg/my-weights", "custom.pt")] = data
    monkeypatch.setenv("LIBREYOLO_HF_REPO", "myorg/my-weights")
    got = W.resolve_weights("custom.pt")
    assert got.read_bytes() == data
    # An explicit repo_id beats the environment.
    with pytest.raises(FileNotFoundError, match="other/repo"):
        W.resolve_weights("custom2.pt", repo_id="other/repo")


@pytest.mark.parametrize("name", ["LibreYOLO9x.pt", "LibreYOLO9t-missing.safetensors"])
def test_download_404(fake_hub: FakeHub, _isolated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        W.resolve_weights(name)
    message = str(info.value)
    repo = W.default_repo_for(name)
    assert f"'{repo}'" in message and "download failed" in message
    assert str(tmp_path / name) in message and str(_isolated / name) in message
    assert not (_isolated / name).exists()
    assert ("HEAD", f"/{repo}/resolve/main/{name}") in fake_hub.requests


def test_download_404_for_missing_file_in_known_repo(fake_hub: FakeHub, _isolated: Path) -> None:
    with pytest.raises(FileNotFoundError, match="LibreYOLO/LibreYOLO9t"):
        W.resolve_weights("other.pt", repo_id="LibreYOLO/LibreYOLO9t")


def test_download_from_hub_in_trouble_is_not_retried(fake_hub: FakeHub, caplog: pytest.LogCaptureFixture) -> None:
    """A hub answering 503 is reported at once: one HEAD, no backoff loop, no GET."""
    fake_hub.fail_with = 503
    start = time.monotonic()
    with caplog.at_level("WARNING"), pytest.raises(FileNotFoundError) as info:
        W.resolve_weights("LibreYOLO9t.pt")
    assert time.monotonic() - start < 5
    assert "download failed" in str(info.value) and "503" in str(info.value)
    assert [method for method, _ in fake_hub.requests] == ["HEAD"]
    assert "Retrying" not in caplog.text


# ---------------------------------------------------------------------------------------------
# No network: the hub check fails fast, without huggingface_hub's retries
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def no_download_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """hf_hub_download must not run when the hub check failed (its retries are what we avoid)."""

    def refuse(**kwargs: object) -> None:
        raise AssertionError("hf_hub_download called although the hub could not be reached")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)


def _closed_loopback_port() -> int:
    """A loopback port nothing listens on (bound once by us, then closed): connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _assert_fast_offline_error(message: str, host: str, timeout_text: str) -> None:
    assert f"the hub ({host}) could not be reached within {timeout_text} s" in message
    assert "download skipped" in message
    assert "set LIBREYOLO_OFFLINE=1 to skip the hub attempt" in message
    assert W.HUB_TIMEOUT_ENV in message


def test_refused_connection_fails_fast(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture, no_download_call: None
) -> None:
    url = f"http://127.0.0.1:{_closed_loopback_port()}"
    _point_hub_at(monkeypatch, tmp_path, url)
    _reset_hub_sessions()
    start = time.monotonic()
    with caplog.at_level("DEBUG"), pytest.raises(FileNotFoundError) as info:
        W.resolve_weights("LibreYOLO9t.pt")
    elapsed = time.monotonic() - start
    assert elapsed < 4, f"took {elapsed:.1f} s"
    _assert_fast_offline_error(str(info.value), url.removeprefix("http://"), "2")
    assert "Connection refused" in str(info.value) or "ConnectError" in str(info.value)
    assert "Retrying" not in caplog.text and "Retry 1/" not in caplog.text


def test_silent_hub_is_bounded_by_the_timeout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture, no_download_call: None
) -> None:
    """A port that accepts connections but never answers: the check gives up after the timeout."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes handshakes; nobody ever reads or answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        _point_hub_at(monkeypatch, tmp_path, url)
        monkeypatch.setenv(W.HUB_TIMEOUT_ENV, "0.5")
        _reset_hub_sessions()
        start = time.monotonic()
        with caplog.at_level("DEBUG"), pytest.raises(FileNotFoundError) as info:
            W.resolve_weights("LibreYOLO9t.pt")
        elapsed = time.monotonic() - start
        _reset_hub_sessions()
    assert 0.4 <= elapsed < 3, f"took {elapsed:.2f} s"
    _assert_fast_offline_error(str(info.value), url.removeprefix("http://"), "0.5")
    assert "Retrying" not in caplog.text


def test_offline_flag_skips_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """LIBREYOLO_OFFLINE=1 (the hint in the error above) means no request at all."""
    _point_hub_at(monkeypatch, tmp_path, f"http://127.0.0.1:{_closed_loopback_port()}")
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "1")

    def no_check(*args: object, **kwargs: object) -> None:
        raise AssertionError("hub checked while offline")

    monkeypatch.setattr(W, "_probe_hub", no_check)
    with pytest.raises(FileNotFoundError) as info:
        W.resolve_weights("LibreYOLO9t.pt")
    message = str(info.value)
    assert "not tried (downloads are disabled by LIBREYOLO_OFFLINE=1)" in message
    assert "skip the hub attempt" not in message  # nothing was attempted


@pytest.mark.parametrize(("value", "expected"), [(None, 2.0), ("", 2.0), ("0.25", 0.25), (" 10 ", 10.0)])
def test_hub_timeout(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: float) -> None:
    if value is None:
        monkeypatch.delenv(W.HUB_TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(W.HUB_TIMEOUT_ENV, value)
    assert W.hub_timeout() == expected


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_bad_hub_timeout_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(W.HUB_TIMEOUT_ENV, value)
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "0")
    with pytest.raises(ValueError, match=rf"{W.HUB_TIMEOUT_ENV}='{value}' is not a positive number of seconds"):
        W.resolve_weights("LibreYOLO9t.pt")


def test_hub_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.example.invalid")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert W.hub_endpoint() == "https://hub.example.invalid"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:8080/")
    assert W.hub_endpoint() == "http://127.0.0.1:8080"


def test_read_only_folder_names_the_target_not_the_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save into a read-only folder fails creating its temp file: the error is the one save
    error, naming the target the caller gave, and does not call a read-only folder a full disk."""
    target = tmp_path / "best.pt"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".best.pt.abcd1234.tmp"))

    monkeypatch.setattr(W.tempfile, "NamedTemporaryFile", read_only)
    monkeypatch.setattr(W.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(W.CheckpointSaveError) as info:
        W.save_checkpoint({"model": {"w": torch.zeros(1000)}}, target)
    text = str(info.value)
    assert f"cannot save checkpoint '{target}'" in text and "read-only filesystem" in text
    assert ".tmp" not in text and "disk is full" not in text
    assert info.value.errno == errno.EROFS and info.value.filename == str(target)
