"""Precision/recall, PR curves, confusion matrix and the validation pictures of detection."""
import numpy as np
import pytest

from libreyolo.tasks.detect.curves import confusion_matrix, pr_summary

GT = [np.array([[0, 10, 10, 50, 50], [1, 60, 60, 90, 90]], np.float64),
      np.array([[1, 0, 0, 20, 20]], np.float64)]


def perfect():
    return [np.array([[*g[1:], 0.9, g[0]] for g in gt]) for gt in GT]


def test_perfect_predictions():
    pr = pr_summary(perfect(), GT, nc=3)
    assert pr.p == 1.0 and pr.r == 1.0 and list(pr.present) == [True, True, False]
    m = confusion_matrix(perfect(), GT, nc=3)
    assert m[0, 0] == 1 and m[1, 1] == 2 and m.sum() == 3


def test_false_positive_missed_box_and_wrong_class():
    preds = perfect()
    preds[0] = np.vstack([preds[0], [100, 100, 120, 120, 0.8, 0]])      # a box on background
    preds[1] = np.array([[0, 0, 20, 20, 0.7, 2]])                       # right place, wrong class
    pr = pr_summary(preds, GT, nc=3)
    # at the best operating point class 0 has P 1/2 or 1 (conf cut), class 1 recall 1/2
    assert 0 < pr.r < 1 and 0 < pr.p <= 1
    m = confusion_matrix(preds, GT, nc=3)
    assert m[0, 3] == 1          # predicted class 0 on background
    assert m[2, 1] == 1          # a class-1 object predicted as class 2
    assert m[1, 1] == 1 and m[0, 0] == 1
    low = confusion_matrix(preds, GT, nc=3, conf=0.85)                  # only the 0.9 boxes remain
    assert low[3, 1] == 1 and low[0, 3] == 0


def test_an_epoch_that_found_nothing_reports_p_and_r_zero():
    """Objects present and nothing detected (an untrained model's first epoch): P 0, not the
    curves' 1.0 of classes without detections; the same with detections that are all wrong."""
    pr = pr_summary([np.zeros((0, 6)), np.zeros((0, 6))], GT, nc=3)
    assert pr.p == 0.0 and pr.r == 0.0
    assert pr.precision[pr.present].min() == 1.0       # the curves keep their convention
    wrong = [np.array([[100, 100, 120, 120, 0.8, 0]]), np.array([[0, 0, 20, 20, 0.7, 2]])]
    pr = pr_summary(wrong, GT, nc=3)
    assert pr.p == 0.0 and pr.r == 0.0


def test_no_ground_truth_and_no_predictions():
    pr = pr_summary([np.zeros((0, 6))], [np.zeros((0, 5))], nc=2)
    assert pr.p == pr.r == 0.0
    assert confusion_matrix([np.zeros((0, 6))], [GT[1]], nc=2)[2, 1] == 1


def test_evaluator_plots_its_pictures(tmp_path):
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.tasks.detect import DetectOptions
    from libreyolo.tasks.detect.task import DetectionEvaluator
    m = LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0)
    ev = DetectionEvaluator(m, DetectOptions())
    imgs = torch.randint(0, 255, (2, 3, 96, 96), dtype=torch.uint8)
    ev.preds, ev.gts, ev.first_batch = perfect(), GT, imgs.numpy()
    names = [p.name for p in ev.plot(tmp_path)]
    assert names == ["pr_curve.png", "confusion_matrix.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg"]
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)


def _reference_match(pred, gt, thr):
    """Greedy matching the plain way: every prediction, highest confidence first, takes the
    unmatched ground truth of its class with the highest IoU >= thr."""
    tp, taken = np.zeros(len(pred), bool), np.zeros(len(gt), bool)
    for i in sorted(range(len(pred)), key=lambda k: -pred[k, 4]):
        best, best_iou = None, thr
        for j in range(len(gt)):
            if taken[j] or int(gt[j, 0]) != int(pred[i, 5]):
                continue
            x1, y1 = max(pred[i, 0], gt[j, 1]), max(pred[i, 1], gt[j, 2])
            x2, y2 = min(pred[i, 2], gt[j, 3]), min(pred[i, 3], gt[j, 4])
            inter = max(x2 - x1, 0.0) * max(y2 - y1, 0.0)
            union = (pred[i, 2] - pred[i, 0]) * (pred[i, 3] - pred[i, 1]) + (gt[j, 3] - gt[j, 1]) * (gt[j, 4] - gt[j, 2]) - inter
            v = inter / union
            if v >= best_iou and (best is None or v > best_iou):
                best, best_iou = j, v
        if best is not None:
            taken[best] = tp[i] = True
    return tp


@pytest.mark.parametrize("seed", range(6))
def test_matching_is_the_greedy_reference(seed):
    """Crowded images (boxes jittered around few ground truths, several classes, tied scores): the
    matcher's true positives are the plain greedy loop's."""
    from libreyolo.tasks.detect.curves import _match
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 8))
    xy = rng.uniform(0, 200, (m, 2))
    gt = np.concatenate([rng.integers(0, 3, (m, 1)), xy, xy + rng.uniform(20, 60, (m, 2))], 1)
    n = 120
    src = rng.integers(0, m, n)
    jitter = rng.normal(0, 8, (n, 4)) * (rng.uniform(size=(n, 1)) < 0.7) + rng.normal(0, 60, (n, 4)) * (rng.uniform(size=(n, 1)) >= 0.7)
    boxes = gt[src, 1:5] + jitter
    boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2] + 1.0)
    pred = np.concatenate([boxes, np.round(rng.uniform(size=(n, 1)), 1),
                           np.where(rng.uniform(size=(n, 1)) < 0.8, gt[src, :1], rng.integers(0, 3, (n, 1)))], 1)
    pred = pred[np.argsort(-pred[:, 4], kind="stable")]
    got = _match(pred, gt, 0.5)
    assert got.any() and not got.all()
    np.testing.assert_array_equal(got, _reference_match(pred, gt, 0.5))


def test_evaluator_process_splits_each_images_detections_and_ground_truth():
    """process() keeps, per image, its NMS survivors ([x1, y1, x2, y2, conf, cls]) and its real
    target rows ([cls, x1, y1, x2, y2]), in order, whatever the padding."""
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.ops.nms import nms_per_image
    from libreyolo.tasks.detect import DetectOptions
    from libreyolo.tasks.detect.task import DetectionEvaluator
    m = LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0)
    ev = DetectionEvaluator(m, DetectOptions())
    g = torch.Generator().manual_seed(0)
    b, n = 3, 50
    xy = torch.rand(b, n, 2, generator=g) * 80
    boxes = torch.cat([xy, xy + torch.rand(b, n, 2, generator=g) * 30 + 2], -1)
    scores = torch.rand(b, n, generator=g).sort(1, descending=True).values
    scores[1] = 0.0   # an image without detections
    cls = torch.randint(0, 3, (b, n), generator=g)
    targets = torch.zeros(b, 16, 5)
    mask = torch.zeros(b, 16, dtype=torch.bool)
    for i, k in enumerate((2, 0, 5)):
        targets[i, :k] = torch.rand(k, 5, generator=g) * 50
        mask[i, :k] = True
    batch = (torch.zeros(b, 3, 96, 96, dtype=torch.uint8), targets, mask)
    ev.process((boxes, scores, cls), batch)
    o = ev.options
    dets = nms_per_image(boxes, scores, cls, conf=o.val_conf, iou=o.val_iou, max_det=o.max_det, nms_free=not m.NMS)
    assert len(ev.preds) == len(ev.gts) == b
    for i in range(b):
        np.testing.assert_array_equal(ev.preds[i], dets[dets[:, 0] == i, 1:].numpy())
        np.testing.assert_array_equal(ev.gts[i], targets[i][mask[i]].numpy())
    assert len(ev.preds[1]) == 0 and ev.preds[0].shape[1] == 6 and len(ev.gts[2]) == 5


def test_evaluator_takes_the_stage_s_packed_detections_as_its_host_nms_rows():
    """The device-NMS stage (CUDA with Triton) hands ``process`` one packed (B, max_det * 6 + 1)
    tensor; its per-image predictions are those rows, as the host path's are its NMS's rows."""
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.ops.nms import top_candidates
    from libreyolo.tasks.detect import DetectOptions
    from libreyolo.tasks.detect.task import DetectionEvaluator
    m = LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0)
    g = torch.Generator().manual_seed(0)
    # boxes on a grid, none overlapping: NMS keeps every candidate above conf
    xy = torch.stack(torch.meshgrid(torch.arange(6.0), torch.arange(5.0), indexing="ij"), -1).reshape(1, 30, 2) * 50
    boxes = torch.cat((xy, xy + 30), -1).expand(2, -1, -1).contiguous()
    scores = torch.rand((2, 30), generator=g)
    cls = torch.randint(0, 3, (2, 30), generator=g)
    cand = top_candidates(boxes, scores, cls, 30)
    opts = DetectOptions(val_conf=0.3, max_det=20)
    batch = (torch.zeros((2, 3, 8, 8), dtype=torch.uint8), torch.zeros((2, 4, 5)), torch.zeros((2, 4), dtype=torch.bool))
    host = DetectionEvaluator(m, opts)
    host.process(cand, batch)
    packed = torch.zeros((2, 20 * 6 + 1))
    for i in range(2):
        keep = cand[1][i] > 0.3
        rows = torch.cat((cand[0][i][keep], cand[1][i][keep, None], cand[2][i][keep, None].float()), 1)[:20]
        packed[i, :rows.numel()] = rows.flatten()
        packed[i, -1] = rows.shape[0]
    dev = DetectionEvaluator(m, opts)
    dev.process(packed, batch)
    assert [p.shape[0] for p in host.preds] == [p.shape[0] for p in dev.preds] and host.preds[0].shape[0] > 5
    assert all(np.array_equal(a, b) for a, b in zip(host.preds, dev.preds))
    assert dev.stage_tag == (0.3, opts.val_iou, 20)


def _evaluator():
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.tasks.detect import DetectOptions
    from libreyolo.tasks.detect.task import DetectionEvaluator
    m = LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0)
    ev = DetectionEvaluator(m, DetectOptions())
    ev.preds, ev.gts = perfect(), GT
    ev.first_batch = torch.randint(0, 255, (2, 3, 96, 96), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).numpy()
    return ev


def test_the_plot_child_draws_the_curves_as_this_process_would(tmp_path):
    """With a plot child the two matplotlib figures come from it (the same pictures, the arrays'
    file removed) and this process draws the batch pictures."""
    from libreyolo.engine.plots import PlotProcess
    ev = _evaluator()
    (tmp_path / "here").mkdir()
    (tmp_path / "child").mkdir()
    here = [p.read_bytes() for p in ev.plot(tmp_path / "here")]
    child = PlotProcess()
    ev.plotter = child
    try:
        paths = ev.plot(tmp_path / "child")
        assert child._proc is not None and child.failed is None   # it did draw in the child
    finally:
        child.close()
    assert [p.name for p in paths] == ["pr_curve.png", "confusion_matrix.png", "val_batch0_labels.jpg",
                                       "val_batch0_pred.jpg"]
    assert [p.read_bytes() for p in paths] == here
    assert sorted(p.name for p in (tmp_path / "child").iterdir()) == sorted(p.name for p in paths)


def test_a_plot_child_that_dies_leaves_the_curves_to_this_process(tmp_path, monkeypatch):
    from libreyolo.engine.plots import PlotProcess
    ev = _evaluator()
    child = PlotProcess()
    real_send = child.send

    def send_then_die(request):
        reply = real_send({"csv": "/no/such/file"})   # a request in flight ...
        child._proc.kill()                              # ... when the child dies
        child._proc.wait()
        return reply
    monkeypatch.setattr(child, "send", send_then_die)
    ev.plotter = child
    paths = ev.plot(tmp_path)
    assert [p.name for p in paths][:2] == ["pr_curve.png", "confusion_matrix.png"]
    assert all(p.stat().st_size > 1000 for p in paths) and child.failed is not None
    assert not (tmp_path / ".curves.npz").exists()
