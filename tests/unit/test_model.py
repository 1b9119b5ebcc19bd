"""Factory, checkpoints, predict pipeline and graph modes on the CPU."""
import logging

import numpy as np
import pytest
import torch
from PIL import Image
from rows import SMALL_MODELS

from libreyolo import SAMPLE_IMAGE, LibreYOLO, list_models
from libreyolo.graphs.runner import GraphUnavailableError
from libreyolo.models.base import Model
from libreyolo.models.registry import FAMILIES, get_family, parse_spec
from libreyolo.results import Results


@pytest.fixture(scope="module", params=SMALL_MODELS, ids=lambda r: "-".join(r))
def model(request):
    family, size = request.param
    m = LibreYOLO.new(family, size, device="cpu", seed=0)
    _make_detections_likely(m)
    return m


def _make_detections_likely(m):
    """Untrained heads start with strongly negative class/objectness biases (no boxes); lift
    them so that NMS has work to do."""
    for name, mod in m.model.named_modules():
        if "head" in name and isinstance(mod, torch.nn.Conv2d) and mod.bias is not None:
            torch.nn.init.constant_(mod.bias, 2.0)


def test_registry_table_is_each_classs_own_naming():
    """The registry names families without importing them (parse_spec, weight-file names); its
    table must say what each class says."""
    from libreyolo.models.registry import _TABLE, naming
    for fam, (where, prefix, sizes) in _TABLE.items():
        cls = FAMILIES[fam]
        assert cls.FAMILY == fam and cls.FILE_PREFIX == prefix and tuple(cls.SIZES) == sizes, fam
        assert f"{cls.__module__}:{cls.__name__}" == f"libreyolo.models{where}", fam
        assert naming()[fam] == (prefix, sizes)
    with pytest.raises(KeyError):
        FAMILIES["yolo99"]


def test_building_a_yolo_imports_neither_torchvision_nor_the_other_families():
    """torchvision's import pulls in torch._dynamo (seconds of a process's start): naming and
    building a detector, its task and its training dataset import neither (the DETRs', BiRefNet's
    and the other tasks' modules, which do, load when they are used)."""
    import subprocess
    import sys
    code = ("import sys; from libreyolo import LibreYOLO; m = LibreYOLO('yolo9t', device='cpu'); "
            "import libreyolo.data.augment, libreyolo.engine.trainer, libreyolo.engine.predictor; "
            "m.task_def; "
            "bad = [k for k in ('torchvision', 'torch._dynamo', 'libreyolo.models.rtdetr.model', "
            "'libreyolo.tasks.classify') if k in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def test_registry_rows_are_complete():
    assert set(FAMILIES) >= {"yolo9"}
    for row in list_models():
        assert row["sizes"] and row["task"] and row["file_prefix"]
        # a family's training capture is either the step or, failing that, a front seam: never both
        assert not (row["cuda_graph_train"] and row["cuda_graph_train_seam"]), row
    seam = {r["family"] for r in list_models() if r["cuda_graph_train_seam"]}
    assert seam == {"rtdetr", "rtdetrv2", "rtdetrv4", "dfine", "deim", "deimv2", "ec"}, seam
    assert parse_spec("LibreYOLO9t.pt")[1] == "t" and parse_spec("yolo9-s")[1] == "s"
    assert parse_spec("alexnet.pt") is None and parse_spec("resnet51.pt") is None
    with pytest.raises(ValueError, match="unknown model family"):
        get_family("nope")


def test_untrained_build_is_explicit_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        m = LibreYOLO("yolo9t", device="cpu")
    assert not m.trained and "UNTRAINED" in repr(m)
    assert any("UNTRAINED" in msg for msg in caplog.messages)
    with pytest.raises(ValueError, match="unknown size"):
        LibreYOLO.new("yolo9", "q")


def test_missing_file_is_an_error_that_says_where_and_how(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "1")
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_DIR", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError) as exc:
        LibreYOLO(str(tmp_path / "LibreYOLO9t.pt"), device="cpu")
    msg = str(exc.value)
    assert str(tmp_path / "LibreYOLO9t.pt") in msg and "cache" in msg and "LibreYOLO.new" in msg


def test_checkpoint_round_trip_is_exact_and_atomic(model, tmp_path):
    path = model.save(tmp_path / "sub" / "m.pt")
    assert path.exists() and [p.name for p in path.parent.iterdir()] == ["m.pt"]
    raw = torch.load(path, weights_only=True)
    assert raw["model_family"] == model.FAMILY and raw["size"] == model.size and raw["nc"] == model.nc
    assert raw["names"][0] == "person" and raw["schema_version"] == "1.0"
    back = LibreYOLO(str(path), device="cpu")
    assert back.trained and type(back) is type(model)
    for (k, a), (k2, b) in zip(model.model.state_dict().items(), back.model.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    img = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    r1, r2 = model(img, conf=0.3), back(img, conf=0.3)
    assert torch.equal(r1.boxes.data, r2.boxes.data)


def test_wrong_checkpoint_shapes_named(tmp_path, model):
    ck = model.checkpoint()
    ck["model"]["head.cv3.0.2.weight"] = torch.zeros(3, 3, 1, 1)
    torch.save(ck, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="head.cv3.0.2.weight"):
        LibreYOLO(str(tmp_path / "bad.pt"), device="cpu")


def test_predict_every_source_kind(model, tmp_path):
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    arr = np.ascontiguousarray(np.asarray(pil)[:, :, ::-1])   # numpy arrays are BGR, as OpenCV gives them
    pil.save(tmp_path / "a.jpg")
    pil.resize((320, 240)).save(tmp_path / "b.png")
    ten = torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1).float() / 255
    sources = {
        "path": str(SAMPLE_IMAGE), "dir": str(tmp_path), "glob": str(tmp_path / "*.jpg"), "pil": pil,
        "numpy": arr, "tensor": ten, "batch_tensor": ten.unsqueeze(0).repeat(2, 1, 1, 1),
        "list": [str(SAMPLE_IMAGE), pil, arr],
    }
    expected_len = {"dir": 2, "glob": 1, "batch_tensor": 2, "list": 3}   # the others: one image
    ref = model(arr, conf=0.3)
    assert len(ref) > 0, "the test needs detections"
    for kind, src in sources.items():
        res = model(src, conf=0.3, batch=2)
        if kind in expected_len:   # several images: a list
            assert isinstance(res, list) and len(res) == expected_len[kind], kind
        else:                      # one image: its Results
            assert isinstance(res, Results), kind
            res = [res]
        for r in res:
            assert r.boxes.data.shape[1] == 6 and r.orig_img.dtype == np.uint8
            h, w = r.orig_shape
            xyxy = r.boxes.xyxy
            assert (xyxy[:, 0] >= 0).all() and (xyxy[:, 2] <= w).all() and (xyxy[:, 3] <= h).all()
    assert torch.equal(model(pil, conf=0.3).boxes.data, ref.boxes.data)
    assert torch.equal(model(str(SAMPLE_IMAGE), conf=0.3).boxes.data, ref.boxes.data)


@pytest.mark.parametrize("mode,new_hw,pad", [("topleft", (192, 320), (0, 0)), ("center", (192, 320), (0, 64)),
                                          ("stretch", (320, 320), (0, 0))])
def test_resize_modes_map_back_exactly(mode, new_hw, pad):
    """A white rectangle drawn in the original lands where the inverse mapping says it does."""
    from libreyolo.ops.letterbox import PAD_VALUE, letterbox, letterbox_params, unletterbox_boxes
    img = torch.zeros(1, 300, 500, 3, dtype=torch.uint8)
    img[:, 60:120, 100:300] = 255
    canvas = letterbox(img, 320, mode)
    p = letterbox_params(300, 500, 320, mode)
    assert canvas.shape == (1, 3, 320, 320) and (p.new_h, p.new_w) == new_hw and (p.pad_x, p.pad_y) == pad
    if mode == "topleft":  # padding below the image is grey 114
        below = canvas[0, :, p.new_h:, :]
        assert torch.allclose(below, torch.full_like(below, PAD_VALUE / 255))
    ys, xs = torch.nonzero(canvas[0, 0] > 0.99, as_tuple=True)
    assert ys.min().item() >= p.pad_y
    box = torch.tensor([[xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]], dtype=torch.float)
    back = unletterbox_boxes(box, p.new_w / 500, p.new_h / 300, 300, 500, p.pad_x, p.pad_y)
    assert torch.allclose(back, torch.tensor([[100.0, 60.0, 300.0, 120.0]]), atol=2.0)


def test_unknown_resize_mode_is_refused():
    from libreyolo.ops.letterbox import letterbox_params
    with pytest.raises(ValueError, match="mode"):
        letterbox_params(3, 3, 32, mode="crop")


def test_batched_equals_one_by_one(model):
    """Batching images of different sizes gives each image the outputs it gets alone."""
    from libreyolo.ops.letterbox import letterbox
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    imgs = [np.asarray(pil), np.asarray(pil.resize((500, 400))), np.asarray(pil.rotate(90, expand=True))]
    x = torch.cat([letterbox(torch.from_numpy(im.copy()).unsqueeze(0), 320, model.resize) for im in imgs])
    with torch.no_grad():
        many = model.infer(x)
        for i in range(len(imgs)):
            one = model.infer(x[i:i + 1])
            for a, b in zip(one, many):
                assert torch.allclose(a[0].float(), b[i].float(), atol=1e-4)
    assert [len(r.boxes) >= 0 for r in model(imgs, conf=0.3, batch=3)] == [True] * 3


def test_predict_options(model):
    arr = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    base = model(arr, conf=0.3)
    assert len(model(arr, conf=0.3, max_det=2)) == min(2, len(base))
    only = model(arr, conf=0.3, classes=[0])
    assert (only.boxes.cls == 0).all()
    assert len(model(arr, conf=0.99)) <= len(base)
    with pytest.raises(ValueError, match="conf"):
        model(arr, conf=1.5)
    with pytest.raises(ValueError, match="classes"):
        model(arr, classes=[999])
    with pytest.raises(ValueError, match="amp"):
        model(arr, amp=True)  # CPU


@pytest.mark.parametrize("bad,exc,words", [
    ([], ValueError, "no images"),
    (np.zeros((4, 4, 2), np.uint8), ValueError, "channel"),
    (np.zeros((4, 4, 3), np.int64), ValueError, "int64"),
    (torch.zeros(1, 1, 3, 8, 8), ValueError, "(1, 1, 3, 8, 8)"),
    (42.0, TypeError, "float"),
    (42, ValueError, "camera 42 does not open"),   # an int is a camera index
])
def test_bad_inputs_give_one_clear_error(model, bad, exc, words):
    with pytest.raises(exc) as e:
        model(bad)
    assert words.lower() in str(e.value).lower()


def test_corrupt_and_missing_files(model, tmp_path):
    p = tmp_path / "broken.jpg"
    p.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg" * 10)
    with pytest.raises(ValueError, match="broken.jpg"):
        model(str(p))
    with pytest.raises(FileNotFoundError, match="nothere.jpg"):
        model(str(tmp_path / "nothere.jpg"))


def test_graph_modes_on_cpu(model):
    """A graph-capable family on a CPU: True is a clear error, "auto" runs eager and says why."""
    class Capable(type(model)):
        SUPPORTS_CUDA_GRAPH = True

    model = Capable(model.model, size=model.size, nc=model.nc, device="cpu")
    arr = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    with pytest.raises(GraphUnavailableError, match="CUDA"):
        model(arr, cuda_graph=True)
    eager = model(arr, conf=0.3)
    auto = model(arr, conf=0.3, cuda_graph="auto")
    assert torch.equal(eager.boxes.data, auto.boxes.data)
    info = model.graph_info()
    assert info["graphs"] == [] and info["fallbacks"] and "cpu" in info["fallbacks"][0]["reason"]
    with pytest.raises(GraphUnavailableError):
        model.capture_graph(imgsz=320)


def test_impossible_graph_request_fails_before_any_source_is_read(model, tmp_path, monkeypatch):
    """cuda_graph=True where no graph can run fails at the call, before its sources are read (a
    missing file is not reported instead, a directory of images is not decoded first) and
    before a save folder is made."""
    class Capable(type(model)):
        SUPPORTS_CUDA_GRAPH = True

    m = Capable(model.model, size=model.size, nc=model.nc, device="cpu")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GraphUnavailableError, match="CUDA"):
        m(str(tmp_path / "missing.jpg"), cuda_graph=True, save=True)
    assert not (tmp_path / "runs").exists()


def test_unsupported_family_raises_not_implemented_naming_it():
    class Unsupported(get_family("yolo9")):
        FAMILY = "toyfamily"
        SUPPORTS_CUDA_GRAPH = False
        UNSUPPORTED_REASON = "it has a data-dependent op"

    m = Unsupported.new("t", device="cpu")
    arr = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(NotImplementedError, match="toyfamily"):
        m(arr, cuda_graph=True)
    with pytest.raises(NotImplementedError, match="toyfamily"):   # before the source is read
        m("/nonexistent/image.jpg", cuda_graph=True)
    m(arr, cuda_graph="auto")
    assert "toyfamily" in m.graph_info()["fallbacks"][0]["reason"]


def test_fuse_matches_eager_within_tolerance(model):
    x = torch.rand(1, 3, 160, 160, generator=torch.Generator().manual_seed(3))
    fused = LibreYOLO.new(model.FAMILY, model.size, device="cpu")
    fused.model.load_state_dict(model.model.state_dict())
    with torch.no_grad():
        ref = fused.infer(x)
        n_before = sum(1 for _ in fused.model.parameters())
        fused.fuse()
        out = fused.infer(x)
    assert sum(1 for _ in fused.model.parameters()) < n_before
    assert not any(isinstance(mm, torch.nn.BatchNorm2d) for mm in fused.model.modules())
    for a, b in zip(out[:2], ref[:2]):  # boxes and scores
        assert ((a - b).norm() / b.norm()).item() < 1e-5
    with pytest.raises(ValueError, match="fused"):
        fused.save("never.pt")


def test_imgsz_is_stride_aligned(model, caplog):
    """Rounded up with a note: a warning the first time a size/stride pair is seen in the process,
    a debug line after that (a predict loop is not flooded)."""
    arr = np.zeros((100, 100, 3), np.uint8)
    with caplog.at_level(logging.DEBUG, logger="libreyolo"):
        r = model(arr, imgsz=100)
    assert any("multiple of the stride" in m for m in caplog.messages)
    assert r.orig_shape == (100, 100)


def test_model_base_is_abstract():
    with pytest.raises(NotImplementedError):
        Model.build_network("t", 80)


def test_reset_classes_keeps_the_network_mode_and_predicts_at_batch_1():
    m = LibreYOLO.new("yolo9", "t", seed=0)
    assert not m.model.training
    m.reset_classes(3, ["a", "b", "c"])
    assert not m.model.training          # a fresh module starts in training mode
    r = m(SAMPLE_IMAGE, imgsz=96, conf=0.9)
    assert r.names == {0: "a", 1: "b", 2: "c"}


@pytest.mark.parametrize("spec", [("yolonas", "n", "pose"), ("ec", "s", "pose")])
def test_reset_keypoints_keeps_the_network_mode(spec):
    family, size, task = spec
    m = LibreYOLO.new(family, size, task=task, seed=0)
    for mode in (False, True):
        m.model.train(mode)
        m.reset_keypoints(4)
        assert m.model.training is mode and m.num_keypoints == 4
        m.reset_classes(2)
        assert m.model.training is mode and m.num_keypoints == 4
