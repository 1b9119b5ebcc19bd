"""Instance segmentation's and pose's in-stage selection (the predict plans' ``post`` path: NMS,
selection, gathering and the mapping back inside the stage) against their host path, on the CPU
through Triton's interpreter.

The plans take the in-stage path only where :func:`libreyolo.ops.nms_graph.available` says so
(CUDA with Triton); here it is made to say so in a subprocess whose Triton interprets its kernels
(TRITON_INTERPRET=1 before triton is imported). The same model predicts the same images with both
paths: kept boxes, scores, classes, keypoints and the masks must be the same (bitwise). The
candidates are the network's own where they mean something, else synthetic ones put in place of
the network's boxes and scores (clusters of overlapping boxes, an image of a batch with nothing
above ``conf``, more survivors than ``max_det``, pose keypoints inside and outside the image), the
mask coefficients, prototypes and keypoint visibilities staying the network's. tests/gpu/test_tasks_gpu.py checks graph predict == eager on CUDA, where
this path is the default.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

COMMON = textwrap.dedent('''
    import sys
    import numpy as np
    import torch
    from libreyolo import LibreYOLO
    from libreyolo.ops import nms_graph

    HOST = nms_graph.available
    rng = np.random.default_rng(0)
    IMAGES = [rng.integers(0, 256, hw + (3,), dtype=np.uint8) for hw in ((120, 200), (150, 90), (77, 77))]
    EMPTY = 2   # the image whose candidates all score below conf

    def clusters(b, n, size, g, nc):
        """(b, n) candidates in 6 clusters of overlapping boxes per image, unsorted; image EMPTY's
        scores all below 0.2."""
        centers = torch.rand((b, 6, 2), generator=g) * size
        pick = torch.randint(0, 6, (b, n), generator=g)
        c = centers.gather(1, pick[..., None].expand(-1, -1, 2)) + torch.randn((b, n, 2), generator=g) * 4
        wh = torch.rand((b, n, 2), generator=g) * 40 + 10
        scores = torch.rand((b, n), generator=g)
        if b > EMPTY:
            scores[EMPTY] *= 0.19
        return torch.cat((c - wh / 2, c + wh / 2), -1), scores, torch.randint(0, nc, (b, n), generator=g)

    def both(model, images, **kw):
        """Predict with the host path, then with the in-stage selection; the plans' tags."""
        size = kw["imgsz"]
        nms_graph.available = HOST
        host_plan = model.get_predictor().plan(size, **{k: v for k, v in kw.items() if k not in ("imgsz", "batch")})
        assert host_plan.post is None
        ref = model(images, **kw)
        nms_graph.available = lambda device: True
        plan = model.get_predictor().plan(size, **{k: v for k, v in kw.items() if k not in ("imgsz", "batch")})
        assert plan.post is not None and plan.tag != host_plan.tag, (plan.tag, host_plan.tag)
        got = model(images, **kw)
        nms_graph.available = HOST
        return ref, got
''')

SEGMENT = COMMON + textwrap.dedent('''
    m = LibreYOLO.new("rtmdet", "t", task="segment", seed=0)
    network = m.infer

    def synthetic(x):   # the network's coefficients and prototypes, clustered boxes and scores
        boxes, scores, cls, coeffs, protos = network(x)
        g = torch.Generator().manual_seed(7)
        b, s, c = clusters(scores.shape[0], scores.shape[1], x.shape[-1], g, 3)
        return b, s, c, coeffs, protos

    def check(ref, got, what):
        counts = []
        for a, b in zip(ref, got):
            assert torch.equal(a.boxes.data, b.boxes.data), what
            assert torch.equal(a.masks.data, b.masks.data), what
            assert a.masks.data.shape[1:] == a.orig_shape, what
            counts.append(len(a.boxes.data))
        return counts

    # the network's own candidates (untrained: thin boxes), mixed sizes in one batch; none above 0.99
    ref, got = both(m, IMAGES, imgsz=160, batch=3, conf=0.01, max_nms=64, max_det=20)
    assert check(ref, got, "network") == [20, 20, 20]
    ref, got = both(m, IMAGES[:2], imgsz=160, batch=2, conf=0.99, max_nms=64, max_det=20)
    assert check(ref, got, "none") == [0, 0]
    # synthetic overlaps: NMS per class and class-agnostic; max_det below the survivors
    m.infer = synthetic
    survivors = check(*both(m, IMAGES, imgsz=160, batch=3, conf=0.25, iou=0.5, max_nms=64, max_det=64), "all")
    assert survivors[0] > 8 and survivors[1] > 8 and survivors[EMPTY] == 0, survivors
    for agnostic in (False, True):
        ref, got = both(m, IMAGES, imgsz=160, batch=3, conf=0.25, iou=0.5, max_nms=64, max_det=8,
                        agnostic_nms=agnostic)
        assert check(ref, got, agnostic) == [8, 8, 0]
        assert all(r.masks.data.any() for r in ref[:2]), "masks to compare"
    # a set-prediction head (NMS False: dfine / ec seg): the walk without suppression
    m.NMS = False
    ref, got = both(m, IMAGES, imgsz=160, batch=3, conf=0.25, max_nms=64, max_det=30)
    assert check(ref, got, "nms free") == [30, 30, 0]
    # max_det above the candidates (all 525 anchors at 160 px): the stage keeps at most those
    ref, got = both(m, IMAGES, imgsz=160, batch=3, conf=0.25, max_nms=1000, max_det=600)
    assert 0 < check(ref, got, "max_det above")[0] < 525
    # a class filter keeps the host path
    nms_graph.available = lambda device: True
    assert m.get_predictor().plan(160, classes=[1]).post is None
    print("OK")
''')

POSE = COMMON + textwrap.dedent('''
    m = LibreYOLO.new("yolonas", "n", task="pose", seed=0)
    network = m.infer
    K = 64

    def synthetic(x, visibility=True):   # the network's visibility, clustered boxes, scattered keypoints
        boxes, scores, cls, kpts, vis = network(x)
        g = torch.Generator().manual_seed(11)
        b, s, c = clusters(scores.shape[0], K, x.shape[-1], g, m.nc)
        s, order = s.sort(1, descending=True)
        b = b.gather(1, order[..., None].expand(-1, -1, 4))
        pts = torch.rand(kpts[:, :K].shape, generator=g) * 240 - 40   # keypoints outside the image too
        out = (b, s, c, pts, vis[:, :K])
        return out if visibility else out[:4]

    def check(ref, got, what):
        counts = []
        for a, b in zip(ref, got):
            assert torch.equal(a.boxes.data, b.boxes.data), what
            assert torch.equal(a.keypoints.data, b.keypoints.data), what
            counts.append(len(a.boxes.data))
        return counts

    # the network's own best K candidates (untrained), mixed sizes in one batch
    m.infer = lambda x: tuple(t[:, :K] for t in network(x))
    assert check(*both(m, IMAGES[:2], imgsz=160, batch=2, conf=0.0, max_det=10), "network") == [5, 5]
    m.infer = synthetic
    survivors = check(*both(m, IMAGES, imgsz=160, batch=3, conf=0.25, iou=0.5, max_det=64), "all")
    assert survivors[0] > 6 and survivors[1] > 6 and survivors[EMPTY] == 0, survivors
    ref, got = both(m, IMAGES, imgsz=160, batch=3, conf=0.25, iou=0.5, max_det=6)
    assert check(ref, got, "max_det") == [6, 6, 0]
    kp = ref[0].keypoints.data
    assert (kp[..., 0] < 0).any() and not torch.equal(kp[..., 2], ref[0].boxes.data[:, 4:5].expand_as(kp[..., 2]))
    # no visibility (each keypoint's conf: its instance's score) and a set-prediction head (ec pose)
    m.infer = lambda x: synthetic(x, visibility=False)
    m.NMS = False
    ref, got = both(m, IMAGES, imgsz=160, batch=3, conf=0.25, max_det=12)
    assert check(ref, got, "nms free") == [12, 12, 0]
    # EC pose itself (NMS False, no visibility)
    ec = LibreYOLO.new("ec", "s", task="pose", seed=0)
    ref, got = both(ec, IMAGES, imgsz=160, batch=3, conf=0.0, max_det=15)
    assert check(ref, got, "ec") == [15, 15, 15]
    ref, got = both(ec, IMAGES, imgsz=160, batch=3, conf=0.0, max_det=100)   # above its 60 queries' top-k
    assert check(ref, got, "ec, max_det above") == [60, 60, 60]
    nms_graph.available = lambda device: True
    assert m.get_predictor().plan(160, classes=[0]).post is None
    print("OK")
''')


def run(script):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]


def test_segment_selection_in_the_stage_equals_the_host_path():
    run(SEGMENT)


def test_pose_selection_in_the_stage_equals_the_host_path():
    run(POSE)


@pytest.mark.parametrize("spec", [("yolox", "n", "detect"), ("rtmdet", "t", "segment"),
                                  ("yolonas", "n", "pose"), ("ec", "s", "pose")])
def test_the_in_stage_selections_extra_inputs(spec, monkeypatch):
    """The stage's two cached extra inputs of detection, segment and pose plans (InStageSelection):
    the thresholds [conf, iou] (iou 0 for a head without NMS: EC pose) and the letterbox geometry
    rows of the chunk's images; none on the host path."""
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.ops import nms_graph
    from libreyolo.ops.letterbox import geometry_rows
    family, size, task = spec
    m = LibreYOLO.new(family, size, task=task, seed=0)
    shapes, imgsz = ((120, 200), (77, 77)), 160
    host = m.get_predictor().plan(imgsz, conf=0.3, iou=0.6)
    assert host.post is None and host.extra(shapes, imgsz) == () and host.constant == ()
    monkeypatch.setattr(nms_graph, "available", lambda device: True)
    plan = m.get_predictor().plan(imgsz, conf=0.3, iou=0.6)
    thr, geo = plan.extra(shapes, imgsz)
    assert plan.constant == (1, 2)
    assert torch.equal(thr, torch.tensor([0.3, 0.6 if m.NMS else 0.0]))
    assert torch.equal(geo, torch.tensor(geometry_rows(shapes, imgsz, m.preprocess.resize), dtype=geo.dtype))
    again = plan.extra(shapes, imgsz)
    assert again[0] is thr and again[1] is geo   # cached, not rebuilt per call
