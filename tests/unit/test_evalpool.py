"""The detection evaluation dealt out to child processes class by class (tasks/detect/evalpool):
the same figures as the in-process evaluation, exactly; a pool that fails hands back to it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou as tv_box_iou

pytest.importorskip("faster_coco_eval")

from tuning import tune_defaults  # tests/tuning.py

from libreyolo.tasks.detect import evalpool  # noqa: E402
from libreyolo.tasks.detect.curves import box_iou, pr_summary  # noqa: E402
from libreyolo.tasks.detect.metrics import evaluate_detections  # noqa: E402


def split(seed: int, nc: int = 5, images: int = 40, per_image: int = 120):
    """A weak detector's split: jittered copies of the ground truth with wrong classes mixed in,
    scores rounded to two digits (many ties), images without ground truth, float32 as the
    validation's host copy is."""
    rng = np.random.default_rng(seed)
    preds, gts = [], []
    for _i in range(images):
        m = int(rng.integers(0, 7))
        xy = rng.uniform(0, 250, (m, 2))
        wh = rng.uniform(5, 70, (m, 2))
        g = np.c_[rng.integers(0, nc, m), xy, xy + wh]
        gts.append(g.astype(np.float32))
        n = per_image if m else 4
        j = rng.integers(0, max(m, 1), n)
        base = np.c_[xy[j], xy[j] + wh[j]] if m else rng.uniform(0, 200, (n, 4))
        cls = np.where(rng.uniform(size=n) < 0.6, g[j, 0] if m else 0, rng.integers(0, nc, n))
        preds.append(np.c_[base + rng.normal(0, 6, (n, 4)), np.round(rng.uniform(0.001, 1, n), 2), cls]
                     .astype(np.float32))
    return preds, gts


def chunked(preds, gts, nc, groups, names=None):
    """What the pool's children compute and the parent joins, without the processes."""
    chunks = [evalpool.evaluate_chunk(preds, gts, nc, g) for g in groups]
    return evalpool.join_chunks(chunks, nc, names)


def assert_same(a, pa, b, pb):
    assert a == b   # every float, per class too
    for f in ("precision", "recall", "present", "conf_grid"):
        assert np.array_equal(getattr(pa, f), getattr(pb, f)), f
    assert (pa.best_conf, pa.p, pa.r) == (pb.best_conf, pb.p, pb.r)


@pytest.mark.parametrize("groups", [[[0], [1], [2], [3], [4]], [[0, 3], [1, 4, 2]], [[4, 0, 2, 1, 3]]])
def test_classes_evaluated_apart_give_the_whole_splits_figures(groups):
    preds, gts = split(0)
    names = {c: f"k{c}" for c in range(5)}
    whole, pr = evaluate_detections(preds, gts, 5, names), pr_summary(preds, gts, 5)
    assert whole["map50_95"] > 0.05   # a split with real matches, not all zeros
    assert_same(whole, pr, *chunked(preds, gts, 5, groups, names))


def test_a_class_without_detections_or_ground_truth_in_its_chunk():
    preds, gts = split(1, nc=4)
    preds = [p[p[:, 5] != 2] for p in preds]            # class 2: ground truth, no detection
    gts = [g[g[:, 0] != 3] for g in gts]                # class 3: detections, no ground truth
    whole, pr = evaluate_detections(preds, gts, 4), pr_summary(preds, gts, 4)
    assert whole["per_class"]["2"]["map50"] == 0.0 and "3" not in whole["per_class"]
    assert_same(whole, pr, *chunked(preds, gts, 4, [[2], [3], [0, 1]]))


def test_the_pool_gives_the_in_process_figures_and_hands_back_when_it_fails():
    preds, gts = split(2, images=64, per_image=300)
    names = {c: f"k{c}" for c in range(5)}
    whole, pr = evaluate_detections(preds, gts, 5, names), pr_summary(preds, gts, 5)
    pool = evalpool.EvalPool(2)
    try:
        res = pool.evaluate(preds, gts, 5, names)
        assert res is not None and pool.failed is None
        assert_same(whole, pr, *res)
        assert pool.evaluate(preds[:2], gts[:2], 5, names) is None   # too few rows: not worth the pipes
        pool._procs[0].kill()
        pool._procs[0].wait()
        assert pool.evaluate(preds, gts, 5, names) is None           # a dead child: the caller evaluates
        assert pool.failed and pool.processes == 0
    finally:
        pool.close()


def test_a_child_imports_numpy_and_faster_coco_eval_not_torch(tmp_path):
    """The child runs evalpool.py with metrics.py and curves.py beside it, not the package."""
    import json
    import subprocess
    import sys

    from libreyolo import childproc
    code = childproc._SNIPPET.replace("m.serve()", "m._siblings()[0].coco_backend(); import json; "
                                      "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, evalpool.__file__, "evalpool_child"], capture_output=True,
                         text=True, check=True, cwd=tmp_path).stdout
    mods = set(json.loads(out))
    assert "faster_coco_eval" in mods and "libreyolo_evalpool_curves" in mods
    assert "torch" not in mods and "libreyolo" not in mods and "torchvision" not in mods


def test_the_numpy_box_iou_is_torchvisions_bit_for_bit():
    rng = np.random.default_rng(3)
    a = rng.uniform(0, 300, (200, 4))
    b = rng.uniform(0, 300, (150, 4))
    a[:, 2:] = a[:, :2] + rng.uniform(0, 80, (200, 2))
    b[:, 2:] = b[:, :2] + rng.uniform(0, 80, (150, 2))
    b[:5] = a[:5]                                        # identical boxes: IoU exactly 1
    ref = tv_box_iou(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert np.array_equal(box_iou(a, b), ref)


def test_deal_spreads_the_heavy_classes():
    groups = evalpool.deal(np.array([100, 1, 90, 2, 0]), 2)
    assert sorted(c for g in groups for c in g) == [0, 1, 2, 3, 4]
    assert len(groups) == 2 and all(groups)
    assert {0, 2} not in [set(g) for g in groups]        # the two heavy ones apart
    assert evalpool.deal(np.array([5, 5]), 8) == [[0], [1]]


def test_a_training_run_with_the_pool_has_the_in_process_runs_history(tmp_path, monkeypatch):
    """eval_processes lends the pool to every validation (the wiring; the figures' equality
    on real detections is the tests above): the same results.csv figures."""
    from libreyolo import LibreYOLO
    from libreyolo.data.synthetic import make_shapes_dataset
    data = str(make_shapes_dataset(tmp_path / "ds", n_train=16, n_val=8, imgsz=64, seed=0))
    monkeypatch.setattr(evalpool, "MIN_ROWS", 0)         # a tiny split still goes through the pipes
    used = []
    real = evalpool.EvalPool.evaluate

    def spy(self, *a, **k):
        out = real(self, *a, **k)
        used.append(out is not None)
        return out
    monkeypatch.setattr(evalpool.EvalPool, "evaluate", spy)
    ended = []
    real_close = evalpool.EvalPool.close

    def close(self):
        procs = list(self._procs)
        real_close(self)
        ended.extend(p.returncode for p in procs)
    monkeypatch.setattr(evalpool.EvalPool, "close", close)
    hist = {}
    for n in (0, 2):
        tune_defaults(monkeypatch, eval_processes=n)
        model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
        # loader workers (forked after the pool started: they hold its pipes)
        res = model.train(data=data, epochs=2, batch=8, imgsz=64, workers=2, project=str(tmp_path), name=f"p{n}",
                          warmup_epochs=1, verbose=False, plots=False, seed=0, nbs=16)
        hist[n] = [{k: v for k, v in r.items() if k.startswith(("metrics/", "val/", "train/"))} for r in res["history"]]
    assert used and all(used)                            # both epochs evaluated by the children
    assert ended == [0, 0]                               # ended by their quit message, not killed
    assert hist[0] == hist[2]


def test_the_pool_ends_while_a_forked_process_holds_its_pipes():
    """A DataLoader worker forked after the pool started holds copies of the children's stdin
    write ends, so the pipe's end never reaches them: the quit message ends them (exit status 0,
    not the kill after the wait's timeout)."""
    import multiprocessing as mp
    import time
    pool = evalpool.EvalPool(2)
    holder = mp.get_context("fork").Process(target=time.sleep, args=(60,))
    holder.start()
    procs = list(pool._procs)
    try:
        pool.close()
        assert [p.returncode for p in procs] == [0, 0]
    finally:
        holder.kill()
        holder.join()
