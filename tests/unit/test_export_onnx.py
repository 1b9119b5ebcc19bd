"""ONNX export and the onnxruntime backend: eager predict and the exported graph agree (CPU, fp32).

Per family (tests/rows.py ONNX_MODELS: every family, in every run):
weights that give real, spread-out detections (the fixtures' fill of the model's own layout),
the sample photo and synthetic images, a threshold that keeps tens of detections; the same
detections (one-to-one, same class, scores within 1e-4, boxes within 1e-3 canvas pixels), the
same top-5 classes and probabilities, the same class maps.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from export_parity import BOX_TOL_PX, compare, filled_model, match_detections, parity_images, pick_conf
from rows import ONNX_MODELS, ONNX_STATIC_ONLY
from torch import nn

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.export.onnx import OnnxExportError, read_metadata
from libreyolo.export.onnx_model import OnnxModel
from libreyolo.models.base import Model
from libreyolo.ops.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from libreyolo.results import Results

IMGSZ = 160


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def _rows():
    for fam, size in ONNX_MODELS:
        yield pytest.param(fam, size, id=f"{fam}-{size}")


@pytest.mark.parametrize("family,size", list(_rows()))
def test_export_matches_eager_predict(tmp_path, family, size):
    """Export at 160 px; every task's outputs equal eager predict's on four images. Detectors and
    SegFormer are exported dynamic and compared at 192 px (the families of ONNX_STATIC_ONLY:
    static, and dynamic=True refused); a classifier goes through a static batch of 2 (the last
    chunk padded)."""
    m = filled_model(family, size, IMGSZ)
    static_only = family in ONNX_STATIC_ONLY
    dynamic = m.TASK != "classify" and not static_only
    batch = 2 if m.TASK == "classify" else 1
    path = m.export(file=tmp_path / "m.onnx", batch=batch, dynamic=dynamic)
    o = LibreYOLO(str(path), device="cpu")
    assert isinstance(o, OnnxModel) and (o.FAMILY, o.size, o.TASK) == (family, size, m.TASK)
    images = parity_images()
    rows = compare(m, o, images, IMGSZ + 32 if dynamic else IMGSZ)
    assert all(r["n"] > 0 for r in rows)
    if static_only:
        with pytest.raises(OnnxExportError, match="dynamic=True does not hold"):
            m.export(file=tmp_path / "d.onnx", dynamic=True)
        assert not (tmp_path / "d.onnx").exists()
    if batch == 2:   # five images in chunks of two: the last one padded with a zero image
        e = m.predict(images + images[:1], imgsz=IMGSZ)
        r = o.predict(images + images[:1], batch=2)
        assert [x.probs.top5 for x in e] == [x.probs.top5 for x in r]
        assert max(float((x.probs.data - y.probs.data).abs().max()) for x, y in zip(e, r)) <= 1e-4


# ---------------------------------------------------------------- one detector, many options
@pytest.fixture(scope="module")
def yolox(tmp_path_factory):
    torch.set_num_threads(1)
    m = filled_model("yolox", "n", IMGSZ)
    path = m.export(file=tmp_path_factory.mktemp("onnx") / "yolox-n.onnx", max_det=100)
    return m, path, LibreYOLO(str(path), device="cpu")


def test_metadata_says_what_the_graph_is(yolox):
    m, path, o = yolox
    meta = read_metadata(path)
    assert (meta["family"], meta["size"], meta["task"], meta["imgsz"], meta["batch"]) == ("yolox", "n", "detect",
                                                                                          "160", "1")
    assert json.loads(meta["names"]) == {str(k): v for k, v in m.names.items()}
    assert json.loads(meta["preprocess"]) == m.preprocess.as_dict()
    assert (meta["max_det"], meta["max_nms"], meta["nms"], meta["dynamic"]) == ("100", "1000", "true", "false")
    proto = onnx.load(str(path))
    ops = {n.op_type for n in proto.graph.node}
    assert "NonMaxSuppression" in ops and "TopK" in ops
    assert [i.name for i in proto.graph.input] == ["images", "conf_threshold", "iou_threshold", "class_mask"]
    assert [x.name for x in proto.graph.output] == ["dets", "num_dets"]
    assert not list(path.parent.glob(".*.tmp")), "the atomic write left its temp file"


def test_class_filter_agnostic_and_max_det_match_eager(yolox):
    m, path, o = yolox
    img = parity_images()[0]
    conf = pick_conf(m.predict(img, conf=0.001).boxes.conf.numpy(), target=60)
    found = m.predict(img, conf=conf).boxes.cls.long().tolist()
    classes = sorted(set(found))[:2] + [c for c in range(m.nc) if c not in found][:1]
    for opts in ({"classes": classes}, {"max_det": 7}, {"iou": 0.3}, {"agnostic_nms": False}):
        opts = {"conf": conf, **opts}
        e, r = m.predict(img, **opts), o.predict(img, **opts)
        res = match_detections(e.boxes.data.numpy(), r.boxes.data.numpy(), img.shape[:2], IMGSZ, m.preprocess.resize,
                               iou=opts.get("iou", 0.45))
        assert res["n"] > 0 and res["box_canvas"] <= BOX_TOL_PX, (opts, res)
        if "classes" in opts:
            assert set(r.boxes.cls.long().tolist()) <= set(opts["classes"])


def test_what_the_export_fixed_raises_clear_errors(yolox):
    _, path, o = yolox
    with pytest.raises(ValueError, match="exported at imgsz=160"):
        o.predict(SAMPLE_IMAGE, imgsz=224)
    with pytest.raises(ValueError, match="exported with batch=1"):
        o.predict(SAMPLE_IMAGE, batch=4)
    assert len(o.predict(SAMPLE_IMAGE, conf=0.001)) == 100   # the exported max_det is the default
    with pytest.raises(ValueError, match="max_det=300.*max_det=100"):
        o.predict(SAMPLE_IMAGE, max_det=300)
    with pytest.raises(ValueError, match="agnostic_nms"):
        o.predict(SAMPLE_IMAGE, agnostic_nms=True)
    with pytest.raises(NotImplementedError, match="ONNX"):
        o.predict(SAMPLE_IMAGE, cuda_graph=True)
    with pytest.raises(NotImplementedError, match="training is not available for an ONNX model"):
        o.train(data="shapes")
    with pytest.raises(TypeError, match="unknown predict option"):
        o.predict(SAMPLE_IMAGE, topk=3)
    r = o.predict(SAMPLE_IMAGE, cuda_graph="auto", save=False)   # auto never raises: it runs as eager
    assert isinstance(r, Results) and r.boxes is not None


def test_onnx_model_through_the_cli(yolox, tmp_path, capsys):
    from libreyolo.cli import main
    _, path, _ = yolox
    assert main(["predict", f"model={path}", f"source={SAMPLE_IMAGE}", "conf=0.2", "save=false"]) == 0
    assert "cuda_graph=auto: 0 graph(s)" in capsys.readouterr().out


# ----------------------------------------------------------------- a toy family: cheap checks
class Toy(Model):
    """A tiny classifier (conv, pool, linear) built through the shared Model base."""

    FAMILY, TASK, SIZES, STRIDE, DEFAULT_IMGSZ = "toy", "classify", ("n",), 32, 64
    PREPROCESS = Preprocess("stretch", mean=IMAGENET_MEAN, std=IMAGENET_STD)

    @classmethod
    def build_network(cls, size, nc):
        return nn.Sequential(nn.Conv2d(3, 8, 3, 2), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, nc))

    def infer(self, x):
        return self.model(x).float()


class ToyFFT(Toy):
    def infer(self, x):
        return torch.fft.rfft2(self.model[0](x)).abs().flatten(1)[:, :self.nc]


def _toy(cls=Toy):
    return cls.new("n", nc=6, device="cpu", seed=0)


@pytest.mark.parametrize("simplify", [False, True])
def test_toy_classifier_parity_with_and_without_simplify(tmp_path, simplify):
    m = _toy()
    path = m.export(file=tmp_path / "toy.onnx", simplify=simplify, topk=3)
    o = LibreYOLO(str(path), device="cpu")
    for img in parity_images():
        e, r = m.predict(img, topk=3).probs, o.predict(img, topk=3).probs
        assert e.top5 == r.top5 and float((e.data - r.data).abs().max()) <= 1e-5
    assert len(o.predict(SAMPLE_IMAGE).probs.top5) == 3   # the exported topk is predict's default
    with pytest.raises(ValueError, match="topk=5.*topk=3"):
        o.predict(SAMPLE_IMAGE, topk=5)


def test_half_exports_float16_weights(tmp_path):
    m = _toy()
    path = m.export(file=tmp_path / "toy16.onnx", half=True)
    proto = onnx.load(str(path))
    kinds = {onnx.TensorProto.DataType.Name(t.data_type) for t in proto.graph.initializer if len(t.dims) >= 2}
    assert kinds == {"FLOAT16"}
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT   # input stays float32
    o = LibreYOLO(str(path), device="cpu")
    assert o.half
    img = parity_images()[0]
    e, r = m.predict(img).probs, o.predict(img).probs
    assert e.top1 == r.top1 and float((e.data - r.data).abs().max()) <= 1e-2


def test_unexportable_operator_is_named(tmp_path):
    with pytest.raises(OnnxExportError, match=r"toy-n cannot be exported to ONNX.*aten::fft_rfft2"):
        _toy(ToyFFT).export(file=tmp_path / "fft.onnx")
    assert not (tmp_path / "fft.onnx").exists()


def test_bad_export_options(tmp_path):
    m = _toy()
    with pytest.raises(ValueError, match="export format must be one of onnx"):
        m.export(format="tflite")
    with pytest.raises(ValueError, match=r"must end in \.onnx"):
        m.export(file=tmp_path / "x.pt")
    with pytest.raises(ValueError, match="opset"):
        m.export(file=tmp_path / "x.onnx", opset=9)


def test_not_a_libreyolo_onnx_file(tmp_path):
    path = tmp_path / "plain.onnx"
    torch.onnx.export(nn.Linear(2, 2), (torch.rand(1, 2),), str(path), dynamo=False)
    with pytest.raises(ValueError, match="not a libreyolo export"):
        LibreYOLO(str(path))
    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        LibreYOLO(str(tmp_path / "missing.onnx"))


def test_cli_export_writes_the_file(tmp_path, capsys, monkeypatch):
    import libreyolo.cli as cli
    m = _toy()
    ckpt = m.save(tmp_path / "toy.pt")
    # the toy family is not registered, so the CLI's loader is handed the model itself
    monkeypatch.setattr(cli, "_load", lambda opts, seed=None: m)
    out = tmp_path / "cli.onnx"
    assert cli.main(["export", f"model={ckpt}", "imgsz=64", f"file={out}", "topk=2"]) == 0
    assert out.is_file() and read_metadata(out)["topk"] == "2"
    assert "exported toy-n (classify)" in capsys.readouterr().out


def test_dynamic_export_refused_where_the_graph_bakes_its_size(tmp_path):
    """A family whose traced graph fixes a size-dependent shape: dynamic=True raises, no file."""
    class Baked(Toy):
        def infer(self, x):   # a grid built outside torch from the input's size: a traced constant
            ramp = torch.from_numpy(np.linspace(0.0, 1.0, x.shape[-1], dtype=np.float32))
            return self.model(x * ramp).float()
    with pytest.raises(OnnxExportError, match="dynamic=True does not hold"):
        _toy(Baked).export(file=tmp_path / "baked.onnx", dynamic=True)
    assert not (tmp_path / "baked.onnx").exists()
    assert _toy(Toy).export(file=tmp_path / "ok.onnx", dynamic=True).is_file()


def test_cli_export_of_a_detector_in_a_fresh_process(tmp_path):
    """``libreyolo export`` as a user runs it: a new interpreter that has not imported torchvision
    yet (the library imports it where it is used). Its first import inside the trace - the NMS's
    forward - recorded one of torchvision's own operators and failed the export."""
    import subprocess
    import sys
    ckpt = LibreYOLO.new("yolox", "n", device="cpu", seed=0).save(tmp_path / "yoloxn.pt")
    out = tmp_path / "yoloxn.onnx"
    code = ("import sys, libreyolo.cli as cli; assert 'torchvision' not in sys.modules; "
            f"sys.exit(cli.main(['export', 'model={ckpt}', 'imgsz=64', 'file={out}']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert out.is_file() and read_metadata(out)["family"] == "yolox"


def test_exported_candidates_rank_nan_scores_last(tmp_path):
    """The ONNX graph's candidate sort (export.onnx.top_sorted) ranks a NaN score last, as predict's
    does (ops.nms.nan_last), infinities kept."""
    import onnxruntime as ort

    from libreyolo.export.onnx import top_sorted

    class Top(nn.Module):
        def forward(self, boxes, scores, cls):
            return top_sorted(boxes, scores, cls, 6)[1]
    path = tmp_path / "top.onnx"
    args = (torch.rand(1, 6, 4), torch.rand(1, 6), torch.zeros(1, 6, dtype=torch.int64))
    torch.onnx.export(Top(), args, str(path), dynamo=False, opset_version=17,
                      input_names=["boxes", "scores", "cls"])
    s = np.array([[0.3, np.nan, 0.9, np.inf, -np.inf, 0.1]], np.float32)
    sess = ort.InferenceSession(str(path))
    feed = {"boxes": args[0].numpy(), "scores": s, "cls": args[2].numpy()}
    got = sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})[0]   # unused inputs are dropped
    assert np.array_equal(got, np.array([[np.inf, 0.9, 0.3, 0.1, -np.inf, -np.inf]], np.float32))


def test_pose_export_matches_eager_predict(tmp_path):
    """A pose model (YOLO-NAS-Pose, input-sensitive weights) exported at 160 px: the graph ends
    in the network's candidates and the loader runs the pose task's NMS on the host; boxes and
    keypoints equal eager predict's within 1e-3 canvas-scale pixels on four images."""
    from libreyolo.engine.verify import input_sensitive
    m = input_sensitive(LibreYOLO.new("yolonas", "n", task="pose", device="cpu", imgsz=IMGSZ))
    o = LibreYOLO(str(m.export(file=tmp_path / "p.onnx")), device="cpu")
    assert o.TASK == "pose" and o.output_names[:4] == ["out0", "out1", "out2", "out3"]
    n = 0
    for im in parity_images():
        e, r = m.predict(im, imgsz=IMGSZ, conf=0.05), o.predict(im, conf=0.05)
        assert len(e.boxes) == len(r.boxes)
        ea, ra = e.boxes.data.numpy(), r.boxes.data.numpy()
        j = [int(np.abs(ra[:, :5] - row[:5]).sum(1).argmin()) for row in ea]
        assert np.abs(ea - ra[j]).max() <= 1e-3
        assert float((e.keypoints.data - r.keypoints.data[j]).abs().max()) <= 1e-3
        n += len(ea)
    assert n > 0
