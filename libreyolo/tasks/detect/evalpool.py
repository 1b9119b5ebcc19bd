"""A detection evaluation spread over child processes, class by class.

COCO scores each (image, class) pair on its own and the PR curves match a prediction only to a
ground truth of its class, so the classes can be evaluated apart: :func:`evaluate_chunk` of a
subset of classes gives those classes' figures exactly as the whole split's evaluation does
(a test compares them). :class:`EvalPool` deals the classes out to child interpreters, which
run this file with its two siblings (:mod:`.metrics`, :mod:`.curves`: numpy and
faster-coco-eval, no torch or package import), and joins their figures. The evaluation is host
Python (tens of thousands of detection records per epoch at ``conf=0.001``), so the children
divide its wall time; the trainer's process waits in a pipe read, without the interpreter lock.

The pipe carries length-prefixed ``.npz`` archives (numbers only, read with
``allow_pickle=False``). A child that cannot start, dies or reports an error makes the pool
give up: the evaluation runs in the caller's process from then on (one debug line).
"""
from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import numpy as np

#: at fewer detection rows than this, the pipes' round trip costs more than it saves
MIN_ROWS = 2000


def _siblings():
    """(metrics, curves): the package's modules, or in a child the files beside this one."""
    if __package__:
        from . import curves, metrics
        return metrics, curves
    import importlib.util
    mods = []
    for name in ("metrics", "curves"):
        key = f"libreyolo_evalpool_{name}"
        if key not in sys.modules:
            spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(f"{name}.py"))
            mod = sys.modules[key] = importlib.util.module_from_spec(spec)   # before running it (dataclasses)
            spec.loader.exec_module(mod)
        mods.append(sys.modules[key])
    return tuple(mods)


def _pack(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    return struct.pack("<Q", len(data)) + data


def _read(stream) -> dict | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    if n == 0:   # the quit message (EvalPool.close)
        return None
    data = stream.read(n)
    if len(data) < n:
        return None
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _flat(arrays: list, cols: int) -> np.ndarray:
    """Per-image (n_i, cols) arrays -> one (sum n_i, cols + 1) float64 array, image index first."""
    metrics, _ = _siblings()
    rows = [metrics.as_array(a, cols) for a in arrays]
    if not rows:
        return np.zeros((0, cols + 1))
    idx = np.repeat(np.arange(len(rows), dtype=np.float64), [len(r) for r in rows])
    return np.concatenate([idx[:, None], np.concatenate(rows)], axis=1)


def _unflat(flat: np.ndarray, n: int, cols: int) -> list[np.ndarray]:
    """:func:`_flat`'s inverse (each image's rows in their order)."""
    cuts = np.searchsorted(flat[:, 0], np.arange(1, n), side="left")
    return [part[:, 1:].reshape(-1, cols) for part in np.split(flat, cuts)]


def evaluate_chunk(preds: list, gts: list, nc: int, classes) -> dict:
    """COCO APs (:func:`~.metrics.coco_ap`) and PR rows (:func:`~.curves.pr_rows`) of
    ``classes`` (ascending) only: ``{"instances" (nc,), "ap_classes" (k,), "ap" (k, T),
    "classes", "precision" (len, G), "recall", "n_gt"}``."""
    metrics, curves = _siblings()
    classes = np.asarray(sorted(int(c) for c in classes), dtype=np.int64)
    instances, ap = metrics.coco_ap(preds, gts, nc, classes=classes)
    precision, recall, n_gt = curves.pr_rows(preds, gts, nc, classes=classes)
    scored = np.asarray(sorted(ap), dtype=np.int64)
    return {"instances": instances, "ap_classes": scored,
            "ap": np.stack([ap[c] for c in scored]) if len(scored) else np.zeros((0, 10)),
            "classes": classes, "precision": precision, "recall": recall, "n_gt": n_gt}


def join_chunks(chunks: list[dict], nc: int, names: dict | None = None):
    """(:func:`~.metrics.evaluate_detections`' dict, :class:`~.curves.PRSummary`) of chunks that
    cover every class once."""
    metrics, curves = _siblings()
    instances = np.zeros(nc, dtype=np.int64)
    ap: dict[int, np.ndarray] = {}
    precision = recall = None
    n_gt = np.zeros(nc, dtype=np.int64)
    for ch in chunks:
        cls = ch["classes"]
        instances[cls] = ch["instances"][cls]
        ap.update({int(c): row for c, row in zip(ch["ap_classes"], ch["ap"])})
        if precision is None:
            precision = np.zeros((nc, ch["precision"].shape[1]))
            recall = np.zeros_like(precision)
        precision[cls], recall[cls], n_gt[cls] = ch["precision"], ch["recall"], ch["n_gt"]
    return (metrics.summarize_ap(instances, ap, nc, names),
            curves.summarize_pr(precision, recall, n_gt, grid=precision.shape[1]))


def deal(weights: np.ndarray, parts: int) -> list[list[int]]:
    """Class indices dealt into at most ``parts`` non-empty groups of about equal weight
    (heaviest first onto the lightest group)."""
    groups: list[list[int]] = [[] for _ in range(max(1, min(parts, len(weights))))]
    load = [0.0] * len(groups)
    for c in np.argsort(-np.asarray(weights, dtype=np.float64), kind="stable"):
        g = int(np.argmin(load))
        groups[g].append(int(c))
        load[g] += float(weights[c]) + 1.0
    return [sorted(g) for g in groups if g]


def serve() -> None:
    """The child's loop: a request (the flat rows of its classes) in, :func:`evaluate_chunk`'s
    arrays out; the quit message (a zero length) or stdin's end ends it. An error is sent back as
    ``{"error": message bytes}``."""
    src, dst = sys.stdin.buffer, sys.stdout.buffer
    metrics, _ = _siblings()   # imported before the first request
    try:
        metrics.coco_backend()
    except ImportError:
        pass   # the first request reports it
    while True:
        req = _read(src)
        if req is None:
            return
        try:
            n, nc = int(req["n"]), int(req["nc"])
            out = evaluate_chunk(_unflat(req["preds"], n, 6), _unflat(req["gts"], n, 5), nc, req["classes"])
        except Exception as exc:  # reported to the parent, which evaluates in its own process
            out = {"error": np.frombuffer(f"{type(exc).__name__}: {exc}".encode(), dtype=np.uint8)}
        dst.write(_pack(**out))
        dst.flush()


class EvalPool:
    """``processes`` child interpreters for :meth:`DetectionEvaluator.evaluate
    <libreyolo.tasks.detect.task.DetectionEvaluator.evaluate>`, started at once (they import
    numpy and faster-coco-eval while the run sets up) and ended by :meth:`close`."""

    def __init__(self, processes: int) -> None:
        from ...childproc import start_child
        self.failed: str | None = None
        self._procs = []
        for _ in range(processes):
            try:
                self._procs.append(start_child(__file__, "libreyolo_evalpool_child"))
            except OSError as exc:
                self._fail(f"could not start: {exc}")
                break

    def _fail(self, why: str) -> None:
        import logging
        logging.getLogger(__name__).debug("evaluating in this process (evaluation pool %s)", why)
        self.failed = why
        self.close()

    @property
    def processes(self) -> int:
        return len(self._procs)

    def evaluate(self, preds: list, gts: list, nc: int, names: dict | None = None):
        """(metrics dict, PRSummary) of the split, as :func:`~.metrics.evaluate_detections` and
        :func:`~.curves.pr_summary` give them; None when the pool is not worth it (few rows, one
        class, no children) or has failed (the caller evaluates itself)."""
        if self.failed is not None or len(self._procs) < 2 or nc < 2:
            return None
        flat_p, flat_g = _flat(preds, 6), _flat(gts, 5)
        if len(flat_p) < MIN_ROWS:
            return None
        weights = np.bincount(flat_p[:, 6].astype(np.int64).clip(0, nc), minlength=nc + 1)[:nc]
        groups = deal(weights, len(self._procs))
        pc, gc = flat_p[:, 6].astype(np.int64), flat_g[:, 1].astype(np.int64)
        busy = []
        try:
            for proc, group in zip(self._procs, groups):
                sel = np.asarray(group)
                proc.stdin.write(_pack(preds=flat_p[np.isin(pc, sel)], gts=flat_g[np.isin(gc, sel)],
                                       n=np.int64(len(preds)), nc=np.int64(nc), classes=sel))
                proc.stdin.flush()
                busy.append(proc)
            chunks = [_read(proc.stdout) for proc in busy]
        except (OSError, ValueError) as exc:
            self._fail(f"failed: {exc}")
            return None
        for proc, ch in zip(busy, chunks):
            if ch is None:
                self._fail(f"lost a child (exit status {proc.poll()})")
                return None
            if "error" in ch:
                self._fail(f"child error: {bytes(ch['error']).decode(errors='replace')}")
                return None
        return join_chunks(chunks, nc, names)

    def close(self) -> None:
        """End the children (the quit message; killed if not gone within 10 s)."""
        from ...childproc import end_children
        procs, self._procs = self._procs, []
        end_children(procs, struct.pack("<Q", 0))
