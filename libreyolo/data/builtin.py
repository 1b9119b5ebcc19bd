"""What the built-in synthetic datasets share: their cache folder, the sizes they accept, the
atomic build-once into that folder, and the manifest that says a set is complete.

Most of them (``shapes``, ``shapes-seg``, ``shapes-depth``) pair each generated image with one
label file under ``images/<split>/`` and ``<labels>/<split>/``: :class:`PairedSet` writes such a
set, and each set declares only how one image and its label are drawn and how the label is saved.
``shapes-cls`` (one folder per class, no label files) uses the cache, build-once and manifest only.

Every set is deterministic (each image has its own seeded generator), idempotent (a complete set
with a matching manifest is reused) and atomic (written into a temporary folder that is renamed
into place, so an interrupted run or two processes racing never leave half a set behind).

Generation: :func:`write_images` writes a set's images in chunks, in a pool of worker processes
once the set is large enough to pay for the pool (:data:`POOL_MIN_PIXELS`), each worker drawing
and writing its images and label files itself and sending back only their SHA-256. The files are
byte-identical to a one-process run (the manifest is written last, by the caller). The number of
workers is ``min(cores, 16)`` by default; ``$LIBREYOLO_DATASET_WORKERS`` sets it (``1``: no pool,
everything in the calling process; a larger number: a pool even for a small set).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

from ..device import available_cores

__all__ = ["JPEG_QUALITY", "POOL_MIN_PIXELS", "WORKERS_ENV", "PairedSet", "build_once", "cache_root", "check_sizes",
           "dataset_workers", "default_datasets_dir", "file_sha256", "image_size", "sized_params", "write_images",
           "write_manifest"]

LOGGER = logging.getLogger(__name__)

#: JPEG quality of every built-in set's images.
JPEG_QUALITY = 92

#: The environment variable that sets how many processes generate a built-in set.
WORKERS_ENV = "LIBREYOLO_DATASET_WORKERS"
#: Below this many pixels in all (images x long side squared) a set is generated in the calling
#: process: starting the pool and splitting the work would cost about what the other cores save.
#: On 2 cores the break-even lies near 4 million pixels (about 40 images at 320 px); twice that
#: leaves a margin (the measurements: benchmarks/results/history.md, "Built-in set generation").
POOL_MIN_PIXELS = 8_000_000
_MAX_WORKERS = 16


def default_datasets_dir() -> Path:
    """Where built-in datasets live: ``$LIBREYOLO_DATASETS_DIR`` or ``~/.cache/libreyolo/datasets``."""
    env = os.environ.get("LIBREYOLO_DATASETS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "libreyolo" / "datasets"


def check_sizes(kind: str, n_train: int, n_val: int, imgsz: int) -> None:
    """Refuse split sizes below one image and an ``imgsz`` below 32 pixels, naming the set."""
    if n_train < 1 or n_val < 1:
        raise ValueError(f"n_train and n_val must be >= 1, got {n_train} and {n_val}")
    if imgsz < 32:
        raise ValueError(f"imgsz must be >= 32 for the {kind} dataset, got {imgsz}")


def sized_params(version: str, n_train: int, n_val: int, imgsz: int, seed: int) -> dict:
    """The manifest parameters of a set sized by split counts and image size."""
    return {"version": version, "n_train": int(n_train), "n_val": int(n_val), "imgsz": int(imgsz),
            "seed": int(seed)}


def cache_root(root: Path | str | None, name: str) -> Path:
    """The absolute folder of a set: ``root`` when given, else ``<datasets dir>/<name>``."""
    if root is None:
        root = default_datasets_dir() / name
    return Path(root).expanduser().absolute()


def build_once(root: Path, params: dict, kind: str, generate: Callable[[Path, dict], None], what: str) -> Path:
    """``root/data.yaml`` of a built-in dataset, generated into ``root`` unless it already holds a
    complete one with these ``params`` (its manifest says so). ``generate(tmp, params)`` writes
    every file and, last, the manifest into a temporary sibling folder, which is renamed onto
    ``root`` at once: readers never see half a dataset, and when two processes race the second
    uses the first one's copy. A ``root`` holding something else is refused, naming it."""
    if _is_complete(root, params):
        LOGGER.debug("%s dataset found complete at %s", kind, root)
        return root / "data.yaml"
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(
            f"cannot create the {kind} dataset at '{root}': it exists and is not a complete {kind} "
            "dataset with these parameters; remove it or choose another root"
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        LOGGER.info("generating the %s dataset (%s) in %s", kind, what, root)
        generate(tmp, params)
        try:
            os.rename(tmp, root)  # atomic; also replaces an empty directory left at root
        except OSError:
            if _is_complete(root, params):  # another process finished first: use its copy
                return root / "data.yaml"
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root / "data.yaml"


def _is_complete(root: Path, params: dict) -> bool:
    """True when ``root`` holds a finished dataset generated with ``params``."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("params") != params:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or "data.yaml" not in files:
        return False
    return all((root / rel).is_file() for rel in files)


def write_manifest(out: Path, params: dict, files: dict[str, str], data_yaml: str) -> None:
    """Write ``data.yaml`` and, last (its presence marks the set complete), ``manifest.json``: the
    parameters and the SHA-256 of every file, ``files`` (relative path -> hash) plus data.yaml."""
    (out / "data.yaml").write_text(data_yaml)
    files["data.yaml"] = file_sha256(out / "data.yaml")
    manifest = {"params": params, "files": dict(sorted(files.items()))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def image_size(rng: np.random.Generator, imgsz: int) -> tuple[int, int]:
    """(width, height): half the images are square; the others have a short side of 60%..100% of
    ``imgsz`` (the long side)."""
    if rng.random() < 0.5:
        return imgsz, imgsz
    short = int(round(imgsz * rng.uniform(0.6, 1.0)))
    return (imgsz, short) if rng.random() < 0.5 else (short, imgsz)


def dataset_workers(n_pixels: int) -> int:
    """How many processes generate a set of ``n_pixels`` pixels in all: ``$LIBREYOLO_DATASET_WORKERS``
    when set (a positive integer), else 1 below :data:`POOL_MIN_PIXELS` and ``min(cores, 16)``
    above it (the cores this process may run on)."""
    env = os.environ.get(WORKERS_ENV, "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{WORKERS_ENV} must be a positive integer (the number of processes that "
                             f"generate a built-in dataset), got {env!r}")
        return n
    if n_pixels < POOL_MIN_PIXELS:
        return 1
    return min(available_cores(), _MAX_WORKERS)


def write_images(kind: str, jobs: list[tuple[str, int]], write_one: Callable[[tuple[str, int]], dict[str, str]],
                 long_side: int) -> dict[str, str]:
    """Run ``write_one(job)`` for every ``(split, index)`` job - it writes that image's files and
    returns their SHA-256 by relative path - and return the union of those dicts.

    ``long_side`` (the images' long side, pixels) sizes the work: a set below
    :data:`POOL_MIN_PIXELS` runs in this process, a larger one in a pool of
    :func:`dataset_workers` processes, in chunks of consecutive jobs (the progress bar advances per
    finished chunk). Every job's output depends on the job alone, so the files are the same bytes
    either way. An error in any job stops the generation (pending chunks cancelled, the workers
    joined) and is raised here as it was raised there, with a note naming the set and the image
    (Python >= 3.11); a worker that dies is a RuntimeError naming the set.
    """
    workers = dataset_workers(len(jobs) * long_side * long_side)
    # ~4 chunks a worker balance uneven images; at most 16 images a chunk bound how long Ctrl-C
    # waits (pending chunks are cancelled, those running or already queued to a worker finish)
    chunk = max(1, min(16, math.ceil(len(jobs) / (4 * workers))))
    chunks = [jobs[k:k + chunk] for k in range(0, len(jobs), chunk)]
    workers = min(workers, len(chunks))
    if multiprocessing.current_process().daemon:  # a daemonic process may not start children
        workers = 1
    files: dict[str, str] = {}
    with tqdm(total=len(jobs), desc=f"{kind} dataset", unit="img", leave=False, disable=len(jobs) < 200) as bar:
        if workers <= 1:
            for job in jobs:
                files.update(_write_chunk(kind, write_one, [job]))
                bar.update(1)
        else:
            _write_in_pool(kind, write_one, chunks, workers, files, bar)
    return files


def _write_chunk(kind: str, write_one: Callable[[tuple[str, int]], dict[str, str]],
                 chunk: list[tuple[str, int]]) -> dict[str, str]:
    """``write_one`` over ``chunk``; an error is re-raised with a note naming the set and the image."""
    files: dict[str, str] = {}
    for split, i in chunk:
        try:
            files.update(write_one((split, i)))
        except Exception as exc:
            if hasattr(exc, "add_note"):  # Python >= 3.11; the note travels back from a worker
                exc.add_note(f"while writing {split} image {i} of the {kind} dataset")
            raise
    return files


def _pool_context() -> multiprocessing.context.BaseContext:
    """'fork' on Linux: a worker starts in milliseconds with the parent's modules imported, while
    'spawn' and 'forkserver' re-import libreyolo (torch with it, seconds a worker) and re-run an
    unguarded main script. Forking a process that holds a CUDA context is safe here because the
    workers never touch torch: they draw with numpy and PIL and write files (and torch's at-fork
    hook makes a CUDA call in a forked child fail loudly instead of hanging). Elsewhere (macOS,
    Windows) fork is unsafe or absent: 'spawn', which needs ``write_one`` to be picklable."""
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


_WORKER_WRITE: Callable[[tuple[str, int]], dict[str, str]] | None = None


def _init_worker(write_one: Callable[[tuple[str, int]], dict[str, str]]) -> None:
    """A worker keeps ``write_one`` (forked: inherited, never pickled) and leaves Ctrl-C to the
    parent, which cancels the pending chunks and joins the workers."""
    global _WORKER_WRITE
    _WORKER_WRITE = write_one
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pool_task(kind: str, chunk: list[tuple[str, int]]) -> dict[str, str]:
    assert _WORKER_WRITE is not None, "the worker was not initialised"
    return _write_chunk(kind, _WORKER_WRITE, chunk)


def _write_in_pool(kind: str, write_one: Callable[[tuple[str, int]], dict[str, str]],
                   chunks: list[list[tuple[str, int]]], workers: int, files: dict[str, str], bar: tqdm) -> None:
    """The chunks over ``workers`` processes, their hashes into ``files``; the first error raised
    once the pool is shut down (pending chunks cancelled, running ones finished, workers joined)."""
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context(), initializer=_init_worker,
                               initargs=(write_one,))
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns on forking a multi-threaded process (torch's thread pools);
            # the workers run no code that could wait on a lock held by those threads.
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            pending = {pool.submit(_pool_task, kind, c): len(c) for c in chunks}
        while pending:
            done, _ = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in done:
                n = pending.pop(fut)
                files.update(fut.result())  # a worker's error is raised here, as it was raised there
                bar.update(n)
    except BrokenProcessPool as exc:
        raise RuntimeError(f"a worker process generating the {kind} dataset ended abruptly ({exc}); set "
                           f"{WORKERS_ENV}=1 to generate it in this process") from exc
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class PairedSet:
    """A built-in set of JPEG images, each with one label file of the same stem.

    ``kind`` names the set (messages, progress bar); ``version`` starts its manifest and default
    folder name; ``streams`` are the random streams of the train and val images (distinct per set,
    so two sets never hold the same images); ``draw(rng, w, h)`` gives an image (HxWx3 uint8 RGB)
    and its label, which ``save_label(path, label)`` writes to ``<label_dir>/<split>/<stem>
    <label_suffix>``; ``data_yaml`` is the text of the set's ``data.yaml``.
    """

    kind: str
    version: str
    streams: tuple[int, int]
    label_dir: str
    label_suffix: str
    draw: Callable[[np.random.Generator, int, int], tuple[np.ndarray, Any]]
    save_label: Callable[[Path, Any], Any]
    data_yaml: str

    def make(self, root: Path | str | None, n_train: int, n_val: int, imgsz: int, seed: int) -> Path:
        """Write (or reuse) the set and return the path of its ``data.yaml``; ``root`` defaults to
        ``<datasets dir>/<version>-<n_train>-<n_val>-<imgsz>-<seed>``."""
        check_sizes(self.kind, n_train, n_val, imgsz)
        params = sized_params(self.version, n_train, n_val, imgsz, seed)
        root = cache_root(root, f"{self.version}-{n_train}-{n_val}-{imgsz}-{seed}")
        return build_once(root, params, self.kind, self.generate, f"{n_train} train + {n_val} val images")

    def generate(self, out: Path, params: dict) -> None:
        """Every image, label, data.yaml and (last) the manifest into ``out``."""
        imgsz, seed = params["imgsz"], params["seed"]
        jobs = [("train", i) for i in range(params["n_train"])] + [("val", i) for i in range(params["n_val"])]
        for split in ("train", "val"):
            (out / "images" / split).mkdir(parents=True)
            (out / self.label_dir / split).mkdir(parents=True)
        files = write_images(self.kind, jobs, functools.partial(self.write_one, out, imgsz, seed), imgsz)
        write_manifest(out, params, files, self.data_yaml)

    def write_one(self, out: Path, imgsz: int, seed: int, job: tuple[str, int]) -> dict[str, str]:
        """Draw image ``job = (split, index)`` and write it and its label file into ``out``;
        return their SHA-256 by relative path."""
        split, i = job
        rng = np.random.default_rng([seed, self.streams[0] if split == "train" else self.streams[1], i])
        w, h = image_size(rng, imgsz)
        pixels, label = self.draw(rng, w, h)
        stem = f"{split}_{i:06d}"
        img_rel = f"images/{split}/{stem}.jpg"
        lab_rel = f"{self.label_dir}/{split}/{stem}{self.label_suffix}"
        Image.fromarray(pixels).save(out / img_rel, format="JPEG", quality=JPEG_QUALITY)
        self.save_label(out / lab_rel, label)
        return {img_rel: file_sha256(out / img_rel), lab_rel: file_sha256(out / lab_rel)}
