"""ONNX export of the segment, obb and pose variants: ``LibreYOLO("x.onnx")`` gives eager predict's
Results (CPU, fp32, onnxruntime).

Per variant (ROWS): input-sensitive weights (``engine.verify.input_sensitive``) with the network's
constant buffers - anchor grids, sine-embedding periods, point scales, which that redraw would turn
into noise - put back; the four parity images; a per-image threshold keeping about 40 instances,
in a gap between two eager scores. Asserted: the same instances one to one (same class, score
within SCORE_TOL), boxes within BOX_TOL_PX canvas pixels (obb: the four corners), pose keypoints
within the same, and segment masks at each image's size pixel for pixel (at most 1e-4 of an
instance's pixels may differ; measured: none).
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from export_parity import BOX_TOL_PX, SCORE_TOL, match_detections, parity_images, pick_conf

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.export.onnx import OnnxExportError, read_metadata
from libreyolo.export.onnx_model import OnnxModel
from libreyolo.ops.letterbox import inverse_params
from libreyolo.ops.preprocess import Preprocess

IMGSZ = 160
#: the graph's mask logits against eager's (float32 rounding of the same products)
MASK_LOGIT_TOL = 1e-4

#: (family, size, task, dynamic): the variants exported; rtdetrv2 and ec build their decoder's
#: anchor grid for the traced size, so they export static (dynamic=True is refused for them)
ROWS = [
    ("rtmdet", "t", "segment", True),
    ("dfine", "n", "segment", True),
    ("rtdetrv2", "n", "obb", False),
    ("yolonas", "s", "obb", True),
    ("ec", "s", "pose", False),
]

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def task_model(family: str, size: str, task: str, imgsz: int = IMGSZ):
    """An untrained variant with input-sensitive weights, its constant buffers and frozen
    parameters (anchors, valid masks, sine periods, point scales, D-FINE's ``up``) as built."""
    from libreyolo.engine.verify import input_sensitive
    fresh = LibreYOLO.new(family, size, task=task, device="cpu", imgsz=imgsz)
    m = input_sensitive(fresh)
    consts = {k: v for k, v in fresh.model.named_buffers() if "running_" not in k and "num_batches" not in k}
    consts.update({k: v for k, v in fresh.model.named_parameters() if not v.requires_grad})
    m.model.load_state_dict(consts, strict=False)
    return m


def _scores(r, task: str) -> np.ndarray:
    return (r.obb if task == "obb" else r.boxes).conf.numpy()


def _pairs(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """For each row of ``a`` the row of ``b`` it matches (same class, score within SCORE_TOL, the
    nearest coordinates in canvas pixels): equal scores may come in either order."""
    from scipy.optimize import linear_sum_assignment
    d = (np.abs(a[:, None, :-2].astype(np.float64) - b[None, :, :-2]) * scale).max(-1)
    bad = (a[:, None, -1] != b[None, :, -1]) | (np.abs(a[:, None, -2] - b[None, :, -2]) > SCORE_TOL)
    ri, ci = linear_sum_assignment(d + 1e9 * bad)
    assert not bad[ri, ci].any(), "an instance has no counterpart of the same class and score"
    return ci[np.argsort(ri)]


def _corner_gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Largest corner distance of paired rotated boxes (n, 4, 2), the corners' cyclic order
    free (a box at angle ~0 and the same box at ~pi list them from opposite corners)."""
    return np.min([np.abs(a - np.roll(b, k, 1)).max((1, 2)) for k in range(4)], 0)


def mask_logit_gap(m, o, img: np.ndarray, imgsz: int, conf: float, iou: float = 0.45, classes=None,
                   **_) -> float:
    """The graph's ``mask_logits`` rows against the family's own ``mask_logits`` of the instances
    eager selects (the segment task's ``top_instances`` and ``select_instances``, at the graph's
    ``max_det``), before any threshold: the largest difference. The thresholded masks alone can
    hide a wrong assembly where a model's logits keep one sign inside each box (RTMDet-Ins under
    these weights)."""
    from libreyolo.tasks.segment.task import select_instances, top_instances
    x = m.preprocess.resize_images(torch.as_tensor(np.array(img))[None], imgsz)
    with torch.no_grad():
        b, s, c, k, p = top_instances(m.infer(m.preprocess.normalize(x)), o.max_nms)
        keep = select_instances(b[0], s[0], c[0], conf=conf, iou=iou, max_det=o.max_det, classes=classes,
                                nms_free=not m.NMS)
        eager = m.mask_logits(p[0], k[0][keep]).numpy()
        rows = torch.cat((b[0][keep], s[0][keep, None], c[0][keep, None].float()), 1).numpy()
    mask = np.zeros(o.nc, np.float32)
    mask[classes if classes is not None else slice(None)] = 1
    feeds = {"images": x.numpy(), "conf_threshold": np.array([conf], np.float32),
             "iou_threshold": np.array([iou], np.float32), "class_mask": mask}
    out = dict(zip(o.output_names, o.session.run(None, {k: v for k, v in feeds.items() if k in o.input_names})))
    n = int(out["num_dets"][0])
    assert n == len(eager), (n, len(eager))
    if n == 0:
        return 0.0
    j = _pairs(rows, out["dets"][0, :n], np.ones(4))   # equal scores may come in either order
    return float(np.abs(out["mask_logits"][0, j] - eager).max())


def compare_task(m, o, img: np.ndarray, imgsz: int, conf: float | None = None, **opts) -> dict:
    """Eager vs ONNX predict of one image at ``conf`` (default: a threshold keeping about 40
    instances); asserts the parity claim and returns what was measured."""
    task = m.TASK
    if conf is None:
        conf = pick_conf(_scores(m.predict(img, imgsz=imgsz, conf=0.0, **opts), task), 40)
    e, r = m.predict(img, imgsz=imgsz, conf=conf, **opts), o.predict(img, imgsz=imgsz, conf=conf, **opts)
    sx, sy, _, _ = inverse_params(img.shape[0], img.shape[1], imgsz, m.preprocess.resize)
    if task == "obb":
        a, b = e.obb.data.numpy(), r.obb.data.numpy()
        assert len(a) == len(b) > 0, (len(a), len(b))
        j = _pairs(a, b, np.array([sx, sy, sx, sx, 0.0]))
        ca, cb = e.obb.xyxyxyxy.numpy().astype(np.float64), r.obb.xyxyxyxy.numpy()[j]
        gap = float((_corner_gap(ca * sx, cb * sx)).max())      # canvas pixels (letterbox: sx == sy)
        out = {"n": len(a), "corner_canvas": gap, "score": float(np.abs(a[:, 5] - b[j, 5]).max())}
        assert gap <= BOX_TOL_PX and out["score"] <= SCORE_TOL, out
        return out
    a, b = e.boxes.data.numpy(), r.boxes.data.numpy()
    res = match_detections(a, b, img.shape[:2], imgsz, m.preprocess.resize)
    assert res["n"] > 0 and res["tie_swaps"] == 0, res
    assert res["box_canvas"] <= BOX_TOL_PX and res["score"] <= SCORE_TOL, res
    j = _pairs(a, b, np.array([sx, sy, sx, sy]))
    if task == "pose":
        res["kpt_canvas"] = float((np.abs(e.keypoints.data.numpy()[..., :2] - r.keypoints.data.numpy()[j][..., :2])
                                   * np.array([sx, sy])).max())
        assert res["kpt_canvas"] <= BOX_TOL_PX, res
    else:
        res["logit_gap"] = mask_logit_gap(m, o, img, imgsz, conf, **opts)
        assert res["logit_gap"] <= MASK_LOGIT_TOL, res
        ma, mb = e.masks.data.numpy(), r.masks.data.numpy()[j]
        assert ma.shape == mb.shape and ma.shape[1:] == img.shape[:2]
        differ = (ma != mb).sum((1, 2))
        union = (ma | mb).sum((1, 2))
        res.update(mask_pixels=int(ma.sum()), mask_differ=int(differ.sum()),
                   min_iou=float(np.min(((ma & mb).sum((1, 2)) + 1e-9) / (union + 1e-9))))
        assert (differ <= 1e-4 * union).all(), res
    return res


@pytest.mark.slow
@pytest.mark.parametrize("family,size,task,dynamic", [pytest.param(*r, id=f"{r[0]}-{r[1]}-{r[2]}") for r in ROWS])
def test_task_export_matches_eager_predict(tmp_path, family, size, task, dynamic):
    """Export at 160 px (dynamic where the family holds it, compared at 192 px); eager and
    onnxruntime predict agree on the four parity images (see the module docstring)."""
    m = task_model(family, size, task)
    path = m.export(file=tmp_path / "m.onnx", dynamic=dynamic)
    o = LibreYOLO(str(path), device="cpu")
    assert isinstance(o, OnnxModel) and (o.FAMILY, o.size, o.TASK) == (family, size, task)
    assert o.NMS == m.NMS
    imgsz = IMGSZ + 32 if dynamic else IMGSZ
    rows = [compare_task(m, o, img, imgsz) for img in parity_images()]
    assert all(r["n"] > 0 for r in rows)
    if task == "segment":
        assert sum(r["mask_pixels"] for r in rows) >= 100, "(almost) no mask pixel compares (almost) nothing"
    if not dynamic:
        with pytest.raises(OnnxExportError, match="dynamic=True does not hold"):
            m.export(file=tmp_path / "d.onnx", dynamic=True)


# ----------------------------------------------------------- one model per task: graph and options
@pytest.fixture(scope="module")
def rtmdet_seg(tmp_path_factory):
    torch.set_num_threads(1)
    m = task_model("rtmdet", "t", "segment")
    path = m.export(file=tmp_path_factory.mktemp("onnx") / "rtmdet-seg.onnx", max_det=100)
    return m, path, LibreYOLO(str(path), device="cpu")


def test_segment_graph_ends_in_masks(rtmdet_seg):
    m, path, o = rtmdet_seg
    meta = read_metadata(path)
    assert (meta["task"], meta["max_det"], meta["max_nms"], meta["nms"], meta["agnostic_nms"]) == (
        "segment", "100", "1000", "true", "false")
    proto = onnx.load(str(path))
    assert {"NonMaxSuppression", "TopK"} <= {n.op_type for n in proto.graph.node}
    assert [i.name for i in proto.graph.input] == ["images", "conf_threshold", "iou_threshold", "class_mask"]
    assert [x.name for x in proto.graph.output] == ["dets", "num_dets", "mask_logits"]
    # the graph's mask logits are at the prototypes' stride (8): (B, max_det, S/8, S/8)
    sess_out = o.session.get_outputs()[2]
    assert sess_out.shape == [1, 100, IMGSZ // 8, IMGSZ // 8]


def test_segment_options_match_eager(rtmdet_seg):
    """classes, max_det, iou (graph inputs or the host's cut) as eager; what the export fixed
    raises."""
    m, _, o = rtmdet_seg
    img = parity_images()[1]   # 517 x 333: masks sampled at its size cost less than the photo's
    conf = pick_conf(m.predict(img, conf=0.0).boxes.conf.numpy(), 60)
    found = m.predict(img, conf=conf).boxes.cls.long().tolist()
    classes = sorted(set(found))[:2]
    for opts in ({"classes": classes}, {"iou": 0.3}):
        compare_task(m, o, img, IMGSZ, conf=conf, **opts)
    assert compare_task(m, o, img, IMGSZ, conf=conf, max_det=7)["n"] == 7
    assert set(o.predict(img, conf=conf, classes=classes).boxes.cls.long().tolist()) <= set(classes)
    with pytest.raises(ValueError, match="max_det=300.*max_det=100"):
        o.predict(img, max_det=300)
    with pytest.raises(ValueError, match="agnostic_nms"):
        o.predict(img, agnostic_nms=True)
    with pytest.raises(ValueError, match="max_nms"):
        o.predict(img, max_nms=50)


@pytest.mark.slow
def test_segment_batch_of_two_is_each_image_alone(tmp_path):
    """A static batch of 2 with three images (the last chunk padded): each image's instances and
    masks as its own predict."""
    m = task_model("dfine", "n", "segment")
    o = LibreYOLO(str(m.export(file=tmp_path / "b2.onnx", batch=2)), device="cpu")
    images = parity_images()[:3]
    got = o.predict(images, batch=2, conf=0.9)
    assert len(got) == 3
    for img, r in zip(images, got):
        e = m.predict(img, conf=0.9)
        assert len(e.boxes) == len(r.boxes) > 0
        res = match_detections(e.boxes.data.numpy(), r.boxes.data.numpy(), img.shape[:2], IMGSZ,
                               m.preprocess.resize)
        assert res["box_canvas"] <= BOX_TOL_PX, res
        assert r.masks.data.shape[1:] == img.shape[:2]


def test_obb_graph_runs_the_rotated_nms_as_one_loop(tmp_path):
    """YOLO-NAS-R's rotated NMS is inside the graph (one ONNX Loop, the IoU threshold an input):
    eager and ONNX agree at another iou and with agnostic_nms exported."""
    m = task_model("yolonas", "s", "obb")
    path = m.export(file=tmp_path / "r.onnx", agnostic_nms=True, max_det=50)
    proto = onnx.load(str(path))
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Loop") == 1 and len(ops) < 5000
    assert [i.name for i in proto.graph.input] == ["images", "conf_threshold", "iou_threshold", "class_mask"]
    meta = read_metadata(path)
    assert (meta["nms"], meta["agnostic_nms"], meta["max_det"]) == ("true", "true", "50") and "max_nms" not in meta
    o = LibreYOLO(str(path), device="cpu")
    img = parity_images()[0]
    for iou in (0.45, 0.2):
        compare_task(m, o, img, IMGSZ, iou=iou, agnostic_nms=True)
    with pytest.raises(ValueError, match="agnostic_nms"):
        o.predict(img, agnostic_nms=False)


@pytest.fixture(scope="module")
def rtdetrv2_obb(tmp_path_factory):
    torch.set_num_threads(1)
    m = task_model("rtdetrv2", "n", "obb")
    path = m.export(file=tmp_path_factory.mktemp("onnx") / "rtdetrv2-obb.onnx")
    return m, path, LibreYOLO(str(path), device="cpu")


def test_set_prediction_variants_run_no_nms_on_the_host(rtdetrv2_obb):
    """RT-DETRv2-OBB (no NMS): the file says so and the loader runs none. The first ONNX obb
    attempt read a missing 'nms' entry as True and ran the dense families' rotated NMS over its
    300 candidates on the host - 297 boxes where eager gives 300."""
    m, path, o = rtdetrv2_obb
    meta = read_metadata(path)
    assert meta["nms"] == "false" and [i.name for i in onnx.load(str(path)).graph.input] == [
        "images", "conf_threshold", "class_mask"]
    assert o.NMS is False
    e, r = m.predict(SAMPLE_IMAGE, conf=0.05), o.predict(SAMPLE_IMAGE, conf=0.05)
    assert len(e.obb) == len(r.obb) == 300
    compare_task(m, o, parity_images()[1], IMGSZ)


def test_padding_level_of_the_letterbox_travels(rtdetrv2_obb):
    """RT-DETRv2-OBB letterboxes with black (pad 0): the loader's preprocessing keeps it (a
    default of grey 114 dropped the metadata's 'pad' and moved scores by up to 1e-3)."""
    m, _, o = rtdetrv2_obb
    assert m.preprocess.pad == 0.0 and o.preprocess == m.preprocess
    assert json.loads(read_metadata(o.path)["preprocess"])["pad"] == 0.0


def test_every_task_has_an_onnx_stage(tmp_path):
    """Depth, matte, OCR and prompted segmentation, refused before, export too
    (tests/unit/test_export_task_graphs.py has their parity): a toy depth network round-trips."""
    from torch import nn

    from libreyolo.export.onnx import RAW_TASKS, SECOND_GRAPH_TASKS
    from libreyolo.models.base import Model
    from libreyolo.tasks import _TASK_CLASSES
    graphs = {"detect", "segment", "obb", "classify", "semantic", *RAW_TASKS, *SECOND_GRAPH_TASKS}
    # their own exporters: restore's tile network (tests/unit/test_restore.py), embed's two towers
    # (tests/unit/test_embed.py)
    graphs |= {"restore", "embed"}
    assert set(_TASK_CLASSES) <= graphs

    class ToyDepth(Model):
        FAMILY, TASK, SIZES, STRIDE, DEFAULT_IMGSZ = "toydepth", "depth", ("n",), 32, 64
        PREPROCESS = Preprocess("stretch")

        @classmethod
        def build_network(cls, size, nc):
            return nn.Conv2d(3, 1, 3, padding=1)

        def infer(self, x):
            return self.model(x).float()
    m = ToyDepth.new("n", nc=1, device="cpu", seed=0)
    o = LibreYOLO(m.export(file=tmp_path / "d.onnx"))
    img = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    assert np.abs(m.predict(img).depth.data.numpy() - o.predict(img).depth.data.numpy()).max() < 1e-5


def test_self_attention_exports_without_the_fast_path(tmp_path):
    """A self-attention (query, key and value one tensor) in eval mode under no_grad dispatches to
    ``aten::_native_multi_head_attention``, which has no ONNX export (EC-pose's decoder, refused
    before): the export turns the fast path off while tracing, and the graph matches eager."""
    from torch import nn

    from libreyolo.models.base import Model

    class ToyAttn(Model):
        FAMILY, TASK, SIZES, STRIDE, DEFAULT_IMGSZ = "toyattn", "classify", ("n",), 32, 64

        @classmethod
        def build_network(cls, size, nc):
            return nn.ModuleDict({"stem": nn.Conv2d(3, 16, 8, 8), "attn": nn.MultiheadAttention(16, 2, batch_first=True),
                                  "head": nn.Linear(16, nc)})

        def infer(self, x):
            t = self.model["stem"](x).flatten(2).transpose(1, 2)
            t = self.model["attn"](t, t, t, need_weights=False)[0]
            return self.model["head"](t.mean(1)).float()
    m = ToyAttn.new("n", nc=4, device="cpu", seed=0)
    assert torch.backends.mha.get_fastpath_enabled()
    o = LibreYOLO(str(m.export(file=tmp_path / "attn.onnx")), device="cpu")
    assert torch.backends.mha.get_fastpath_enabled()   # put back after the export
    img = parity_images()[0]
    e, r = m.predict(img).probs, o.predict(img).probs
    assert e.top5 == r.top5 and float((e.data - r.data).abs().max()) <= 1e-5


def test_pose_file_keeps_the_skeleton(tmp_path):
    """A trained pose model's skeleton (its dataset's limbs, checkpoint metadata) travels in the
    file: the ONNX model's keypoints draw the same limbs as eager's."""
    from torch import nn

    from libreyolo.models.base import Model

    class ToyPose(Model):
        """Four candidates of three keypoints, from a pooled convolution."""
        FAMILY, TASK, SIZES, STRIDE, DEFAULT_IMGSZ = "toypose", "pose", ("n",), 32, 64
        NMS = False

        @classmethod
        def build_network(cls, size, nc):
            return nn.Sequential(nn.Conv2d(3, 24, 8, 8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Sigmoid())

        def infer(self, x):
            v = self.model(x).reshape(-1, 4, 3, 2) * x.shape[-1]
            boxes = torch.cat((v.amin(2), v.amax(2)), -1)
            scores = v.mean((2, 3)) / x.shape[-1]
            return boxes, scores, torch.zeros_like(scores, dtype=torch.int64), v
    m = ToyPose.new("n", nc=1, device="cpu", seed=0)
    m.meta["skeleton"] = [[0, 1], [1, 2]]
    o = LibreYOLO(str(m.export(file=tmp_path / "p.onnx")), device="cpu")
    img = parity_images()[2]
    e, r = m.predict(img, conf=0.0), o.predict(img, conf=0.0)
    assert len(e.boxes) == len(r.boxes) == 4
    assert e.keypoints.skeleton == r.keypoints.skeleton == ((0, 1), (1, 2))
    assert float((e.keypoints.data - r.keypoints.data).abs().max()) <= 1e-3
