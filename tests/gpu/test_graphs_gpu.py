"""CUDA-graph inference on a real GPU: parity, invalidation, threads, memory, cache.

Run through scripts/gpu-check on the GPU machine; skipped without CUDA.
"""
import gc
import json
import threading

import numpy as np
import pytest
import torch
from conftest import FIXTURES_DIR
from fill import fill_state_dict
from PIL import Image
from rows import FIXTURES, GRAPH_MODELS, PARITY_REDRAW

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import verify_model
from libreyolo.results import Results

pytestmark = pytest.mark.cuda


def filled_model(family, size, salt=""):
    """A model with the fixtures' deterministic weights: dense, varied detections."""
    m = LibreYOLO.new(family, size, device="cuda")
    name = next((n for f, s, n in FIXTURES if (f, s) == (family, size)), None)
    if name is None:
        torch.manual_seed(0)
        return m
    fx = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    layout = [[salt + n, s, d] for n, s, d in fx["layout"]]
    sd = fill_state_dict(layout)
    m.load_state_dict({k[len(salt):]: v for k, v in sd.items()})
    return m


@pytest.fixture(scope="module")
def images():
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    return [np.asarray(pil), np.asarray(pil.resize((640, 480))), np.asarray(pil.rotate(180)),
            np.asarray(pil.resize((333, 517))), np.asarray(pil.transpose(Image.FLIP_LEFT_RIGHT))]


def same_results(a, b):
    a, b = (x if isinstance(x, list) else [x] for x in (a, b))   # one image: one Results
    return len(a) == len(b) and all(torch.equal(x.boxes.data, y.boxes.data) for x, y in zip(a, b))


@pytest.mark.parametrize("family,size", GRAPH_MODELS)
def test_parity_protocol_fp32_and_amp_batch_1_and_8(family, size):
    if family in PARITY_REDRAW:  # untrained: verify_model draws input-sensitive weights (seeded)
        model = LibreYOLO.new(family, size, device="cuda", seed=0)
    else:
        model = filled_model(family, size)
    results = verify_model(model, imgsz=640, batches=(1, 8), amp_dtypes=(None, model.AMP_DTYPE))
    # per dtype and batch: the network, the predict stage, and that stage + the task's post-processing
    assert len(results) == 12
    failed = [r.as_dict() for r in results if not r.passed]
    assert not failed, failed


@pytest.mark.parametrize("family,size", GRAPH_MODELS)
def test_predict_with_graph_equals_eager(family, size, images):
    model = filled_model(family, size)
    for batch, imgs in ((1, images[:1]), (1, images[1:2]), (2, images[:1] * 2), (5, images)):
        eager = model(imgs, batch=batch, conf=0.25)
        assert sum(len(r) for r in eager) > 0
        for _ in range(3):  # first use, u8-stage capture, replay
            assert same_results(model(imgs, batch=batch, conf=0.25, cuda_graph=True), eager)
    assert model.graph_info()["replays"] > 0
    amp_eager = model(images[:1], amp=True)
    for _ in range(3):
        assert same_results(model(images[:1], amp=True, cuda_graph=True), amp_eager)


def test_auto_mode_captures_on_repeat(images):
    model = filled_model("yolo9", "t")
    model(images[0], cuda_graph="auto")
    assert model.graph_info()["graphs"] == []
    for _ in range(3):
        model(images[0], cuda_graph="auto")
    info = model.graph_info()
    assert info["graphs"] and info["replays"] >= 1 and not info["fallbacks"]


def test_no_stale_result_after_move_reload_or_fuse(images):
    model = filled_model("yolo9", "t")
    img = images[1]
    before = model(img)
    assert same_results(model(img, cuda_graph=True), before)
    assert same_results(model(img, cuda_graph=True), before)
    assert model.graph_info()["graphs"]
    # move away and back: new storage, graphs must be re-captured
    model.to("cpu")
    assert isinstance(model(img, cuda_graph="auto"), Results)
    model.to("cuda")
    # (the allocator may hand the weights their old addresses back: then the graphs are
    # still valid and are kept; otherwise they are released and re-captured)
    assert same_results(model(img, cuda_graph=True), before)
    # new weights loaded in place
    other = filled_model("yolo9", "t", salt="other.")
    model.load_state_dict(other.model.state_dict())
    after = model(img, cuda_graph=True)
    assert same_results(after, model(img)) and not same_results(after, before)
    assert model.graph_info()["invalidations"] >= 1
    # fuse replaces modules
    n_inv = model.graph_info()["invalidations"]
    model.fuse()
    fused = model(img, cuda_graph=True)
    assert same_results(fused, model(img))
    assert model.graph_info()["invalidations"] == n_inv + 1


def test_eight_threads_get_their_own_boxes(images):
    model = filled_model("yolo9", "t")
    imgs = [images[i % len(images)] for i in range(8)]
    imgs = [np.ascontiguousarray(np.roll(im, 37 * i, axis=1)) for i, im in enumerate(imgs)]
    expected = [model(im).boxes.data for im in imgs]
    model(imgs[0], cuda_graph=True)
    errors = []

    def work(i):
        try:
            for _ in range(20):
                got = model(imgs[i], cuda_graph=True).boxes.data
                if not torch.equal(got, expected[i]):
                    errors.append(i)
        except Exception as exc:  # surfaced below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_ten_thousand_replays_keep_memory_flat():
    model = filled_model("yolo9", "t")
    x = torch.rand(1, 3, 320, 320, device="cuda")
    runner = model.runner
    # Earlier tests' cyclic garbage (models) is collected first and the collector is paused during
    # the replays: a collection inside the loop once freed 23 MB of it (session 4), which says
    # nothing about the replays; any growth (a leak, cyclic or not) still shows.
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad():
            for _ in range(20):
                runner(("net", 320), model.infer, (x,), mode=True)
            torch.cuda.synchronize()
            start = torch.cuda.memory_allocated()
            for _ in range(10_000):
                runner(("net", 320), model.infer, (x,), mode=True)
            torch.cuda.synchronize()
            end = torch.cuda.memory_allocated()
    finally:
        gc.enable()
    assert end == start, (start, end)
    assert model.graph_info()["graphs"][0]["replays"] >= 10_000


def test_cache_cap_and_eviction_on_gpu():
    model = filled_model("yolo9", "t")
    model.runner.max_graphs = 2
    outs = {}
    with torch.no_grad():
        for b in (1, 2, 3, 1):
            x = torch.rand(b, 3, 256, 256, device="cuda", generator=None)
            got = model.runner(("net", 256), model.infer, (x,), mode=True)
            ref = model.infer(x)
            assert all(torch.equal(g, r) for g, r in zip(got, ref))
            outs[b] = got
    info = model.graph_info()
    assert len(info["graphs"]) == 2 and info["evictions"] == 2 and info["captures"] == 4


def test_capture_graph_then_predict_uses_it(images):
    model = filled_model("yolo9", "t")
    h, w = images[1].shape[:2]
    d = model.capture_graph(imgsz=640, batch=1, source_shape=(h, w))
    assert d["stage"].startswith("('u8'")
    eager = model(images[1])
    assert same_results(model(images[1], cuda_graph=True), eager)
    info = model.graph_info()
    assert info["captures"] == 1 and info["replays"] == 1
    assert model.release_graphs() == 1 and model.graph_info()["graphs"] == []


@pytest.mark.parametrize("how", ["source", "none"])
def test_capture_graph_covers_the_following_requests(images, how):
    """After capture_graph, predict captures nothing more for that request, however often it
    repeats: with a source, its uint8 stage; without, the pinned network stage (every size)."""
    model = filled_model("yolox", "n")
    eager = model(images[1])
    if how == "source":
        d = model.capture_graph(source=images[1])   # at the model's imgsz, as predict below
        assert d["stage"].startswith("('u8'")
    else:
        d = model.capture_graph()
        assert d["stage"].startswith("('net'")
    for _ in range(3):
        assert same_results(model(images[1], cuda_graph=True), eager)
    info = model.graph_info()
    assert info["captures"] == 1 and info["replays"] == 3, info


def test_host_and_device_nms_paths_agree():
    """The packed host NMS (few survivors) and the CUDA NMS (many) give the same detections."""
    from libreyolo.ops.nms import nms_per_image, top_candidates
    g = torch.Generator(device="cuda").manual_seed(0)
    xy = torch.rand((4, 3000, 2), device="cuda", generator=g) * 600
    wh = torch.rand((4, 3000, 2), device="cuda", generator=g) * 80 + 4
    boxes = torch.cat((xy, xy + wh), -1)
    scores = torch.rand((4, 3000), device="cuda", generator=g)
    cls = torch.randint(0, 5, (4, 3000), device="cuda", generator=g)
    cand = top_candidates(boxes, scores, cls, 1000)
    for conf in (0.25, 0.9):
        host = nms_per_image(*cand, conf=conf, iou=0.5)
        dev = nms_per_image(*cand, conf=conf, iou=0.5, host_limit=0)
        assert host.shape[0] > 0 and torch.equal(host, dev), conf


def _reference_nms(b, s, c, conf, iou, max_det, agnostic):
    """Greedy NMS per class with torchvision (no coordinate offsets), merged in score order: in
    candidate order (the candidates are sorted by score), which is how equal scores of two
    classes come out of the in-graph walk."""
    from torchvision.ops import nms
    n = int((s > conf).sum())
    b, s, c = b[:n], s[:n], c[:n]
    if agnostic:
        keep = nms(b, s, iou)
    else:
        keep = torch.cat([idx[nms(b[idx], s[idx], iou)] for idx in
                          (torch.nonzero(c == k).flatten() for k in c.unique())]) if n else torch.zeros(0, dtype=torch.long)
    keep = keep.sort().values[:max_det]
    return torch.cat((b[keep], s[keep, None], c[keep, None].float()), 1)


@pytest.mark.parametrize("agnostic", [False, True])
@pytest.mark.parametrize("k", [1000, 8400])   # predict's max_nms; every anchor of a 640 px head (validation)
def test_in_graph_nms_equals_greedy_torchvision_nms(agnostic, k):
    from libreyolo.ops.nms import top_candidates
    from libreyolo.ops.nms_graph import select_detections
    g = torch.Generator(device="cuda").manual_seed(1)
    xy = torch.rand((3, 9000, 2), device="cuda", generator=g) * 600
    wh = torch.rand((3, 9000, 2), device="cuda", generator=g) * 120 + 4
    cand = top_candidates(torch.cat((xy, xy + wh), -1), torch.rand((3, 9000), device="cuda", generator=g),
                          torch.randint(0, 6, (3, 9000), device="cuda", generator=g), k)
    for conf, iou, max_det in ((0.25, 0.45, 300), (0.05, 0.7, 1000), (0.9, 0.3, 5), (0.001, 0.7, 300)):
        thr = torch.tensor([conf, iou], device="cuda")
        dets, count = select_detections(*cand, thr, max_det, agnostic=agnostic)
        for i in range(3):
            ref = _reference_nms(cand[0][i], cand[1][i], cand[2][i], conf, iou, max_det, agnostic)
            assert int(count[i]) == ref.shape[0] > 0
            assert torch.equal(dets[i, :int(count[i])], ref), (conf, iou, i)
            assert not dets[i, int(count[i]):].any()


def test_validation_nms_in_the_stage_equals_greedy_nms_and_the_host_path_s_metrics():
    """Detection validation on CUDA runs predict's fixed-shape NMS in its stage: each image's
    predictions are exactly greedy per-class NMS of all its candidates (torchvision, no
    coordinate offsets), and the metrics are the host path's (class-offset torchvision NMS,
    whose offsets can round a borderline IoU differently: equal to 1e-4 here)."""
    from libreyolo.ops.nms import top_candidates
    from libreyolo.tasks.detect import DetectOptions
    from libreyolo.tasks.detect.task import DetectionEvaluator
    m = filled_model("yolo9", "t")
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.rand((4, 3, 640, 640), device="cuda", generator=g)
    with torch.no_grad():
        outputs = m.infer(x)
    opts = DetectOptions()
    targets = torch.zeros((4, 6, 5))
    targets[:, :, 0] = torch.arange(6) % m.nc
    targets[:, :, 1:3] = torch.rand((4, 6, 2)) * 400
    targets[:, :, 3:] = targets[:, :, 1:3] + 80
    batch = (torch.zeros((4, 3, 8, 8), dtype=torch.uint8), targets, torch.ones((4, 6), dtype=torch.bool))
    dev = DetectionEvaluator(m, opts)
    out = dev.finish(outputs)
    assert isinstance(out, torch.Tensor) and out.shape == (4, opts.max_det * 6 + 1)
    dev.process(out, batch)
    cand = top_candidates(*outputs, DetectionEvaluator.MAX_CANDIDATES)
    assert cand[1].shape[1] == 8400
    for i in range(4):
        ref = _reference_nms(cand[0][i], cand[1][i].float(), cand[2][i], opts.val_conf, opts.val_iou, opts.max_det, False)
        assert ref.shape[0] > 10 and torch.equal(torch.from_numpy(dev.preds[i]), ref.cpu()), i
    host = DetectionEvaluator(m, opts)
    host.device_nms = lambda scores: False
    host.process(host.finish(outputs), batch)
    a, b = dev.evaluate(), host.evaluate()
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-4 for k in a if isinstance(a[k], float)), (a, b)


def test_predict_post_stage_is_captured_with_nms(images):
    """With Triton, predict captures NMS too: one graph per signature, boxes equal eager's."""
    m = filled_model("yolo9", "t")
    eager = m(images[1], cuda_graph=False)
    graph = [m(images[1], cuda_graph=True) for _ in range(3)][-1]
    stages = [g["stage"] for g in m.graph_info()["graphs"]]
    assert any("post" in str(st) for st in stages), stages
    assert torch.equal(eager.boxes.data, graph.boxes.data) and len(eager) > 0


def test_pinned_uploads_arrive_intact_and_equal_direct(images):
    """Back-to-back uploads never share a staging buffer until it is released (after the wait
    that covers them), and predict gives the same boxes through the pinned staging path and the
    direct one."""
    from libreyolo.engine.predictor import Predictor
    model = filled_model("yolo9", "t")
    p = model.get_predictor()
    frames = [np.ascontiguousarray(np.roll(images[0], 101 * i, axis=0)) for i in range(6)]
    key = (tuple(frames[0].shape), torch.uint8)
    results, default = {}, Predictor.STAGE_MIN_THREADS
    Predictor.STAGE_MIN_THREADS = 1   # the staging path whatever torch's thread count in this worker
    try:
        for _ in range(2):  # first six fresh buffers, then the same six again from the free list
            torch.cuda._sleep(20_000_000)  # keep the stream busy (~10 ms) so that the uploads queue behind it
            ups = [p._upload(f) for f in frames]
            assert not p._local.free.get(key) and len(p._local.busy) == 6
            assert all(torch.equal(u.cpu(), torch.from_numpy(f)) for u, f in zip(ups, frames))
            p._release_staging()
            assert len(p._local.free[key]) == 6 and not p._local.busy
    finally:
        Predictor.STAGE_MIN_THREADS = default
    for name, min_threads in (("pinned", 1), ("direct", 1 << 30)):
        Predictor.STAGE_MIN_THREADS = min_threads
        try:
            results[name] = [model(f, cuda_graph=mode).boxes.data for f in frames[:3] for mode in (False, True)]
        finally:
            Predictor.STAGE_MIN_THREADS = default
    assert all(torch.equal(a, b) for a, b in zip(results["pinned"], results["direct"]))
    assert sum(len(r) for r in results["pinned"]) > 0


def test_host_copies_are_ordered_before_the_next_replay():
    """Outputs copied to the host straight from a graph's buffers: four replays queued behind a
    busy stream, each HostCopy still holds its own call's numbers after the later replays."""
    from libreyolo.graphs.runner import GraphRunner
    net = torch.nn.Linear(64, 32).cuda()
    runner = GraphRunner(net, "toy", True)
    t = torch.tensor([0.5, 2.0], device="cuda")

    def fn(x, t):
        return net(x).sigmoid() * t[1] - t[0]
    xs = [torch.randn(8, 64, device="cuda") for _ in range(4)]
    with torch.no_grad():
        runner("s", fn, (xs[0], t), True, host=True, constant=(1,)).wait()
        torch.cuda._sleep(20_000_000)
        outs = [runner("s", fn, (x, t), True, host=True, constant=(1,)) for x in xs]
        for out, x in zip(outs, xs):
            got = out.wait()
            assert got.is_pinned() and torch.equal(got, fn(x, t).cpu())
    assert runner.info()["captures"] == 1


def test_changed_thresholds_reach_the_graph_and_writing_graphs_are_flagged(images):
    """The cached [conf, iou] tensor is copied into the graph only when another one comes: each
    threshold pair in turn still gives eager's boxes. A captured function that writes its input
    is flagged, so its inputs are always copied."""
    from libreyolo.graphs.capture import CudaGraphCapturer
    m = filled_model("yolox", "n")
    for conf, iou in ((0.25, 0.45), (0.5, 0.45), (0.25, 0.3), (0.25, 0.45)):
        eager = m(images[0], conf=conf, iou=iou)
        for _ in range(2):
            assert same_results(m(images[0], conf=conf, iou=iou, cuda_graph=True), eager), (conf, iou)
    x = torch.randn(16, device="cuda")
    cap = CudaGraphCapturer()
    assert not cap.capture(lambda a: a * 2, (x,)).writes_inputs
    assert cap.capture(lambda a: a.mul_(2) + 1, (x,)).writes_inputs
