"""The built-in sets' generation in a pool of worker processes: the same bytes as one process,
one clear error and nothing left behind when a worker fails, and the worker count's checks."""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

import pytest

import libreyolo.data.builtin as builtin
from libreyolo.data.shapes_cls import make_shapes_cls_dataset
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.tasks.depth.synthetic import make_shapes_depth_dataset
from libreyolo.tasks.semantic.synthetic import make_shapes_seg_dataset

SIZES = dict(n_train=24, n_val=8, imgsz=64)

SETS = {
    "shapes": lambda root: make_shapes_dataset(root, **SIZES),
    "shapes-easy": lambda root: make_shapes_dataset(root, style="easy", **SIZES),
    "shapes-cls": lambda root: make_shapes_cls_dataset(root, n_train=24, n_val=8),
    "shapes-seg": lambda root: make_shapes_seg_dataset(root, **SIZES),
    "shapes-depth": lambda root: make_shapes_depth_dataset(root, **SIZES),
}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def pool_calls(monkeypatch):
    """The worker counts of the pools started (so a test knows the pool really ran)."""
    calls = []
    real = builtin._write_in_pool

    def spy(kind, write_one, chunks, workers, files, bar):
        calls.append((kind, workers, len(chunks)))
        return real(kind, write_one, chunks, workers, files, bar)

    monkeypatch.setattr(builtin, "_write_in_pool", spy)
    return calls


@pytest.mark.parametrize("name", list(SETS))
def test_pool_writes_the_bytes_of_one_process(name, tmp_path, monkeypatch, pool_calls):
    monkeypatch.setenv(builtin.WORKERS_ENV, "1")
    one = tree(SETS[name](tmp_path / "one").parent)
    assert pool_calls == []
    monkeypatch.setenv(builtin.WORKERS_ENV, "2")
    two = tree(SETS[name](tmp_path / "two").parent)
    assert len(pool_calls) == 1 and pool_calls[0][1] == 2 and pool_calls[0][2] >= 2
    assert "manifest.json" in two and len(two) == len(one) > 32
    assert two == one  # every image, label, data.yaml and the manifest, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]  # no temporary folder left


def test_a_worker_error_is_one_error_and_leaves_nothing(tmp_path, monkeypatch, pool_calls):
    """An image failing in a worker: its error (with a note naming the image) raised in the parent,
    no dataset and no temporary folder left, every worker process ended; then a retry works."""
    parent = os.getpid()
    pids = tmp_path / "pids"
    pids.mkdir()
    real = builtin.PairedSet.write_one

    def failing(self, out, imgsz, seed, job):
        if job == ("train", 13):
            (pids / str(os.getpid())).touch()
            raise RuntimeError("disk on fire")
        return real(self, out, imgsz, seed, job)

    monkeypatch.setattr(builtin.PairedSet, "write_one", failing)
    monkeypatch.setenv(builtin.WORKERS_ENV, "2")
    root = tmp_path / "data" / "s"
    with pytest.raises(RuntimeError) as info:
        make_shapes_dataset(root, **SIZES)
    assert str(info.value) == "disk on fire"  # the worker's own error, not a pool error
    assert pool_calls and pool_calls[0][1] == 2
    assert "disk on fire" in str(info.value.__cause__)  # the worker's traceback, from concurrent.futures
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == ["while writing train image 13 of the shapes dataset"]
    failed_in = [int(p.name) for p in pids.iterdir()]
    assert len(failed_in) == 1 and failed_in[0] != parent  # it did fail in a worker
    assert list((tmp_path / "data").iterdir()) == []  # neither the root nor a temporary folder
    assert multiprocessing.active_children() == []
    with pytest.raises(ProcessLookupError):
        os.kill(failed_in[0], 0)
    monkeypatch.setattr(builtin.PairedSet, "write_one", real)
    assert make_shapes_dataset(root, **SIZES).is_file()


def test_a_worker_that_dies_is_one_clear_error(tmp_path, monkeypatch):
    real = builtin.PairedSet.write_one

    def dying(self, out, imgsz, seed, job):
        if job == ("val", 2):
            os._exit(3)  # as if killed: no exception travels back
        return real(self, out, imgsz, seed, job)

    monkeypatch.setattr(builtin.PairedSet, "write_one", dying)
    monkeypatch.setenv(builtin.WORKERS_ENV, "2")
    with pytest.raises(RuntimeError, match="a worker process generating the shapes dataset ended abruptly"
                                           r".*LIBREYOLO_DATASET_WORKERS=1"):
        make_shapes_dataset(tmp_path / "data" / "s", **SIZES)
    assert list((tmp_path / "data").iterdir()) == []
    assert multiprocessing.active_children() == []


def _generate_in_daemon(root, queue):
    make_shapes_dataset(root, **SIZES)
    queue.put((root / "manifest.json").read_bytes())  # every file's SHA-256; small enough for the pipe


def test_a_daemonic_process_generates_without_a_pool(tmp_path, monkeypatch):
    """A daemonic process (a DataLoader worker, say) may not start children: it writes the set itself."""
    monkeypatch.setenv(builtin.WORKERS_ENV, "2")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_generate_in_daemon, args=(tmp_path / "d", queue), daemon=True)
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    monkeypatch.setenv(builtin.WORKERS_ENV, "1")
    one = make_shapes_dataset(tmp_path / "one", **SIZES).parent
    assert queue.get(timeout=5) == (one / "manifest.json").read_bytes()

def test_worker_count(monkeypatch):
    monkeypatch.delenv(builtin.WORKERS_ENV, raising=False)
    monkeypatch.setattr(builtin, "available_cores", lambda: 40)
    assert builtin.dataset_workers(builtin.POOL_MIN_PIXELS - 1) == 1  # a tiny set: no pool
    assert builtin.dataset_workers(builtin.POOL_MIN_PIXELS) == 16  # capped
    monkeypatch.setattr(builtin, "available_cores", lambda: 2)
    assert builtin.dataset_workers(2200 * 640 * 640) == 2
    monkeypatch.setenv(builtin.WORKERS_ENV, "3")
    assert builtin.dataset_workers(10) == 3  # the override applies to a tiny set too
    monkeypatch.setenv(builtin.WORKERS_ENV, " ")
    assert builtin.dataset_workers(10) == 1  # blank: as if unset
    for bad in ("two", "0", "-1", "1.5"):
        monkeypatch.setenv(builtin.WORKERS_ENV, bad)
        with pytest.raises(ValueError, match=f"LIBREYOLO_DATASET_WORKERS must be a positive integer.*got '{bad}'"):
            builtin.dataset_workers(10)


def test_the_default_sizes_pick_one_process_or_the_pool(monkeypatch):
    """What the threshold means for the sets as used: the test-sized and the default small sets stay
    in one process, the detection set at its defaults and the 640-px benchmark set use the pool."""
    monkeypatch.delenv(builtin.WORKERS_ENV, raising=False)
    monkeypatch.setattr(builtin, "available_cores", lambda: 16)
    assert builtin.dataset_workers(32 * 64 * 64) == 1
    assert builtin.dataset_workers((200 + 50) * 128 * 128) == 1  # shapes-seg / shapes-depth defaults
    assert builtin.dataset_workers((320 + 64) * 320 * 320) == 16  # shapes defaults
    assert builtin.dataset_workers((2000 + 200) * 640 * 640) == 16


@pytest.mark.slow
def test_spawned_workers_write_the_same_bytes(tmp_path, monkeypatch, pool_calls):
    """The start method used where fork is unsafe (macOS, Windows): each worker imports libreyolo
    afresh and receives its writer pickled (seconds a worker, hence slow)."""
    monkeypatch.setattr(builtin, "_pool_context", lambda: multiprocessing.get_context("spawn"))
    monkeypatch.setenv(builtin.WORKERS_ENV, "1")
    one = tree(SETS["shapes-seg"](tmp_path / "one").parent)
    monkeypatch.setenv(builtin.WORKERS_ENV, "2")
    assert tree(SETS["shapes-seg"](tmp_path / "two").parent) == one
    assert len(pool_calls) == 1
