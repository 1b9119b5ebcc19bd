"""Classification on the CPU: predict, Probs, the ImageFolder reader, shapes-cls, collate, loss, a short training."""
import csv
import json
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from rows import CLASSIFY_SMALL_MODELS

from libreyolo import SAMPLE_IMAGE, LibreYOLO, list_models
from libreyolo.data.imagefolder import resolve_classify_data
from libreyolo.data.shapes_cls import SHAPES_CLS_NAMES, make_shapes_cls_dataset
from libreyolo.models.registry import get_family, parse_spec
from libreyolo.tasks import get_task
from libreyolo.tasks.classify import ClassificationEvaluator, ClassifyLoss, ClassifyOptions, Probs
from libreyolo.tasks.classify.data import ClassifyCollate

NC = 10
NAMES = [f"kind{i}" for i in range(NC)]


@pytest.fixture(scope="module", params=CLASSIFY_SMALL_MODELS, ids=lambda r: "-".join(r))
def model(request):
    family, size = request.param
    m = LibreYOLO.new(family, size, nc=NC, names=NAMES, imgsz=64, device="cpu", seed=0)
    # an untrained head gives nearly uniform probabilities; spread the logits so that the top
    # classes are well separated (no near-ties for batching noise to reorder)
    with torch.no_grad():
        m.model.state_dict()[m.NC_KEY].mul_(40.0)
    return m


@pytest.fixture(scope="module")
def sample():
    return np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))


def _check_probs(r, nc=NC, k=5):
    p = r.probs
    assert isinstance(p, Probs) and p.data.shape == (nc,) and r.boxes is None and len(r) == 0
    assert abs(float(p.data.sum()) - 1.0) < 1e-5 and float(p.data.min()) >= 0
    conf = p.top5conf
    assert len(p.top5) == len(conf) == min(k, 5)
    assert all(float(a) >= float(b) for a, b in zip(conf[:-1], conf[1:])), "top5 not sorted"
    assert p.top1 == int(p.data.argmax()) and p.top5[0] == p.top1
    assert torch.allclose(conf, p.data[p.top5])
    assert set(p.top5) == set(torch.topk(p.data, len(p.top5)).indices.tolist())


def test_predict_path_and_numpy(model, sample, tmp_path):
    r_path = model(str(SAMPLE_IMAGE))
    r_np = model(sample, color_format="rgb")
    for r in (r_path, r_np):
        _check_probs(r)
    assert torch.equal(r_path.probs.data, r_np.probs.data)
    rows = json.loads(r_np.to_json())
    assert [d["class"] for d in rows] == r_np.probs.top5
    assert all(d["name"] == NAMES[d["class"]] and 0 <= d["confidence"] <= 1 for d in rows)
    out = r_np.save(tmp_path / "pred.png")
    drawn = np.asarray(Image.open(out).convert("RGB"))
    assert drawn.shape == sample.shape
    assert not np.array_equal(drawn[:40, :120], sample[:40, :120]), "no label box at the top-left"
    assert np.array_equal(drawn[-40:, -120:], sample[-40:, -120:]), "drawing outside the label box"
    saved = model(sample, color_format="rgb", save=True, save_dir=tmp_path / "runs")
    assert saved.saved_to and (tmp_path / "runs" / "image0.jpg").is_file()


def test_batch_of_mixed_sizes_equals_one_by_one(model, sample):
    pil = Image.fromarray(sample)
    imgs = [sample, np.asarray(pil.resize((300, 200))), np.asarray(pil.rotate(90, expand=True))]
    many = model(imgs, batch=3)
    for im, r in zip(imgs, many):
        one = model(im)
        assert torch.allclose(one.probs.data, r.probs.data, atol=1e-5)
        assert one.probs.top5 == r.probs.top5


def test_topk_option_and_errors(model, sample):
    r = model(sample, topk=3)
    assert len(r.probs.top) == 3 and len(r.probs.top5) == 3 and len(r.summary()) == 3
    assert len(model(sample, topk=50).probs.top) == NC  # clipped to nc
    for bad in (0, -1, 2.5, "x"):
        with pytest.raises(ValueError, match="topk"):
            model(sample, topk=bad)
    with pytest.raises(TypeError, match="conf"):
        model(sample, conf=0.5)   # a detection option


def test_probs_conversions_and_summary():
    data = torch.tensor([0.1, 0.6, 0.05, 0.25])
    p = Probs(data)   # top classes from the data
    assert p.top5 == [1, 3, 0, 2] and p.top1 == 1 and math.isclose(float(p.top1conf), 0.6, rel_tol=1e-6)
    n = p.numpy()
    assert isinstance(n.data, np.ndarray) and isinstance(n.top5conf, np.ndarray) and n.top5 == p.top5
    assert isinstance(n.to(torch.float64).data, torch.Tensor) and n.to(torch.float64).data.dtype == torch.float64
    assert p.cpu().data is not None and torch.equal(p.cpu().data, data)
    s = p.summary({0: "a", 1: "b", 2: "c", 3: "d"}, decimals=2)
    assert s[0] == {"name": "b", "class": 1, "confidence": 0.6} and [d["class"] for d in s] == [1, 3, 0, 2]
    img = np.full((120, 200, 3), 200, np.uint8)
    drawn = p.plot_on(img, {1: "b"})
    assert drawn.shape == img.shape and drawn.dtype == np.uint8 and (drawn[:2, :2] < 100).all()
    assert (drawn[-20:, -20:] == 200).all()
    with pytest.raises(ValueError, match="shape"):
        Probs(torch.zeros(2, 3))


def test_evaluator_top1_top5():
    class M:
        nc = 6
    ev = ClassificationEvaluator(M())
    logits = torch.tensor([[9.0, 8, 7, 6, 5, 0],     # label 0: top-1 hit
                           [9.0, 8, 7, 6, 5, 0],     # label 4: top-5 hit only
                           [9.0, 8, 7, 6, 5, 0]])    # label 5: miss
    targets = F.one_hot(torch.tensor([0, 4, 5]), 6).float()
    ev.process(logits, (None, targets))
    ev.process(logits[:1], (None, targets[:1]))
    assert ev.evaluate() == {"top1": 0.5, "top5": 0.75}
    ev.reset()
    assert all(math.isnan(v) for v in ev.evaluate().values())


def test_soft_target_loss_is_cross_entropy_with_label_smoothing():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 7, generator=g)
    labels = torch.randint(0, 7, (8,), generator=g)
    items = [(torch.zeros(3, 4, 4, dtype=torch.uint8), int(c), True) for c in labels]
    _, targets = ClassifyCollate(7, label_smoothing=0.1)(items)
    loss, parts = ClassifyLoss()(logits, targets)
    ref = F.cross_entropy(logits, labels, label_smoothing=0.1)
    assert torch.allclose(loss, ref, atol=1e-6) and parts.shape == (1,) and ClassifyLoss.item_names == ("cls",)
    assert get_task("classify").build_loss(None).item_names == ("cls",)


def test_collate_soft_targets_mixup_cutmix_and_validation():
    g = torch.Generator().manual_seed(1)
    imgs = [torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g) for _ in range(6)]
    train = [(im, i % 3, True) for i, im in enumerate(imgs)]
    val = [(im, i % 3, False) for i, im in enumerate(imgs)]
    x, t = ClassifyCollate(3)(train)
    assert x.dtype == torch.uint8 and x.shape == (6, 3, 16, 16) and torch.equal(t, F.one_hot(torch.arange(6) % 3, 3).float())
    torch.manual_seed(0)
    for mix in (dict(mixup=0.8), dict(cutmix=1.0), dict(mixup=0.8, cutmix=1.0)):
        x, t = ClassifyCollate(3, label_smoothing=0.1, **mix)(train)
        assert x.dtype == torch.uint8 and t.shape == (6, 3)
        assert torch.allclose(t.sum(1), torch.ones(6)) and (t >= 0.1 / 3 - 1e-6).all()
    xv, tv = ClassifyCollate(3, mixup=0.8, label_smoothing=0.1)(val)
    assert torch.equal(xv, torch.stack(imgs)) and torch.equal(tv, F.one_hot(torch.arange(6) % 3, 3).float())


def test_options_are_checked():
    assert ClassifyOptions().label_smoothing == 0.1
    for bad in (dict(auto_augment="autoaugment"), dict(label_smoothing=1.0), dict(scale=0.0), dict(mixup=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ClassifyOptions(**bad)


# ------------------------------------------------------------------ datasets
def _tree(root, layout):
    """layout: {"train/a": 2, ...}: that many small PNGs in each folder (0 makes an empty folder)."""
    rng = np.random.default_rng(0)
    for folder, n in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(root / folder / f"{i}.png")
    return root


def test_imagefolder_root_yaml_and_names(tmp_path):
    root = _tree(tmp_path / "ds", {"train/cat": 2, "train/ant": 3, "val/cat": 1, "val/ant": 1})
    (root / "train" / "ant" / ".DS_Store").write_bytes(b"\0junk")   # hidden: ignored
    d = resolve_classify_data(root)
    assert d.names == {0: "ant", 1: "cat"} and d.nc == 2 and len(d.train) == 5 and len(d.val) == 2
    assert sorted({c for _, c in d.train}) == [0, 1]
    (root / "data.yaml").write_text("path: .\ntrain: train\nval: val\nnames: [cat, ant]\n")
    d2 = resolve_classify_data(str(root / "data.yaml"))
    assert d2.names == {0: "cat", 1: "ant"} and {p.parent.name: c for p, c in d2.train} == {"cat": 0, "ant": 1}
    assert resolve_classify_data(root).names == d2.names   # a folder holding data.yaml reads it
    with pytest.raises(FileNotFoundError, match="nowhere"):
        resolve_classify_data(tmp_path / "nowhere")


@pytest.mark.parametrize("problem", ["empty class folder", "not an image", "not an image suffix",
                                     "val class missing from train"])
def test_imagefolder_bad_input_is_one_clear_error_naming_the_path(tmp_path, problem):
    root = _tree(tmp_path / "ds", {"train/a": 2, "train/b": 2, "val/a": 1, "val/b": 1})
    if problem == "empty class folder":
        culprit = root / "train" / "c"
        culprit.mkdir()
    elif problem == "not an image":
        culprit = root / "train" / "a" / "broken.jpg"
        culprit.write_bytes(b"this is text, not a jpeg")
    elif problem == "not an image suffix":
        culprit = root / "val" / "b" / "notes.txt"
        culprit.write_text("hello")
    else:
        culprit = _tree(root, {"val/zebra": 1}) / "val" / "zebra"
    with pytest.raises(ValueError, match=re.escape(str(culprit))):
        resolve_classify_data(root)


def test_shapes_cls_is_deterministic(tmp_path):
    a = make_shapes_cls_dataset(tmp_path / "a", n_train=12, n_val=6, seed=3)
    b = make_shapes_cls_dataset(tmp_path / "b", n_train=12, n_val=6, seed=3)
    ma, mb = (json.loads((p.parent / "manifest.json").read_text()) for p in (a, b))
    assert ma == mb and len(ma["files"]) == 12 + 6 + 1
    assert make_shapes_cls_dataset(tmp_path / "a", n_train=12, n_val=6, seed=3) == a   # reused
    d = resolve_classify_data(str(a))
    assert d.names == dict(enumerate(SHAPES_CLS_NAMES)) and len(d.train) == 12 and len(d.val) == 6
    assert sorted(c for _, c in d.val) == sorted(list(range(6)))
    sizes = {Image.open(p).size for p, _ in d.train}
    assert all(64 <= s <= 96 for wh in sizes for s in wh) and len(sizes) > 1
    c = make_shapes_cls_dataset(tmp_path / "c", n_train=12, n_val=6, seed=4)
    assert json.loads((c.parent / "manifest.json").read_text())["files"] != ma["files"]


def test_datasets_give_uint8_crops_and_validation_matches_predict_resize(tmp_path):
    yaml_path = make_shapes_cls_dataset(tmp_path / "ds", n_train=6, n_val=6)
    m = LibreYOLO.new("resnet", "18", nc=6, device="cpu")
    data = get_task("classify").resolve_data(str(yaml_path))
    train, val, collate = get_task("classify").datasets(data, 48, m, ClassifyOptions(auto_augment="randaugment"))
    x, cls, aug = train[0]
    assert x.dtype == torch.uint8 and x.shape == (3, 48, 48) and aug
    xv, _, aug = val[0]
    assert xv.shape == (3, 48, 48) and not aug
    img = torch.from_numpy(np.asarray(Image.open(data.val[0][0]).convert("RGB")).copy())
    ref = m.preprocess.resize_images(img.unsqueeze(0), 48)[0]
    assert (xv.float() / 255 - ref).abs().max() <= 0.5 / 255 + 1e-6
    images, targets = collate([train[i] for i in range(4)])
    assert images.shape == (4, 3, 48, 48) and targets.shape == (4, 6)


# ------------------------------------------------------------------ registry
def test_classifier_families_are_registered():
    rows = {r["family"]: r for r in list_models()}
    sizes = {"resnet": ["18", "34", "50", "101", "152"], "efficientnetv2": ["b0", "b1", "b2", "b3", "s", "m", "l"],
             "mobilenetv4": ["s", "m", "l", "hm", "hl"], "convnext": ["t", "s", "b", "l"]}
    for fam, expected in sizes.items():
        assert rows[fam]["task"] == "classify" and rows[fam]["sizes"] == expected
        cls = get_family(fam)
        assert parse_spec(f"{cls.FILE_PREFIX}{expected[0]}.pt") == (cls, expected[0])
        assert parse_spec(f"{fam}-{expected[-1]}") == (cls, expected[-1])
    eff = get_family("efficientnetv2")
    assert eff.preprocess_for("b1").crop_pct == 0.882 and eff.preprocess_for("s").mean == (0.5, 0.5, 0.5)
    assert eff.CONFIGS["b3"].imgsz == 300


def test_checkpoint_keeps_names_preprocess_and_imgsz(tmp_path):
    m = LibreYOLO.new("efficientnetv2", "b1", nc=3, names=["x", "y", "z"], device="cpu", seed=0)
    assert m.imgsz == 240 and m.preprocess.crop_pct == 0.882
    back = LibreYOLO(str(m.save(tmp_path / "e.pt")), device="cpu")
    assert type(back) is type(m) and back.names == {0: "x", 1: "y", 2: "z"} and back.imgsz == 240
    assert back.preprocess == m.preprocess and back.TASK == "classify"
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(m.infer(x), back.infer(x))


# ------------------------------------------------------------------ training
def test_two_epoch_train_then_load_and_val(tmp_path):
    yaml_path = str(make_shapes_cls_dataset(tmp_path / "ds", n_train=12, n_val=6))
    model = LibreYOLO.new("resnet", "18", device="cpu", seed=0)
    res = model.train(data=yaml_path, epochs=2, batch=6, imgsz=64, workers=0, project=str(tmp_path), name="run",
                      verbose=False, seed=0, plots=False, mixup=0.4, cutmix=1.0,
                      auto_augment="trivialaugment")
    assert res["epochs"] == 2 and res["loss_names"] == ["cls"]
    assert all(math.isfinite(v) and v > 0 for epoch in res["losses"] for v in epoch), res["losses"]
    with open(res["run_dir"] + "/results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and {"metrics/top1", "metrics/top5", "train/cls_loss", "val/cls_loss"} <= set(rows[0])
    assert all(math.isfinite(float(r["val/cls_loss"])) and float(r["val/cls_loss"]) > 0 for r in rows)
    assert all(0 <= float(r["metrics/top1"]) <= float(r["metrics/top5"]) <= 1 for r in rows)
    assert 0 <= res["top1"] <= 1 and res["best_metrics"]["top1"] == res["best_fitness"]
    for path in (res["best"], res["last"]):
        back = LibreYOLO(path, device="cpu")
        assert type(back) is type(model) and back.nc == 6 and back.names == dict(enumerate(SHAPES_CLS_NAMES))
        assert back.imgsz == 64 and back.trained
    metrics = back.val(data=yaml_path, batch=6, workers=0)
    assert set(metrics) == {"top1", "top5"} and 0 <= metrics["top1"] <= metrics["top5"] <= 1
    r = back(str(make_shapes_cls_dataset(tmp_path / "ds", n_train=12, n_val=6).parent / "val" / "star"))[0]
    assert r.probs.data.shape == (6,) and r.summary()[0]["name"] in SHAPES_CLS_NAMES


def test_builtin_name_generates_into_the_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path))
    d = get_task("classify").resolve_data("shapes")   # a classify model's "shapes" is shapes-cls
    assert d.source == "shapes-cls" and d.nc == 6 and (len(d.train), len(d.val)) == (600, 120)
    assert d.root.parent == tmp_path and d.root.name.startswith("shapes-cls-")


def test_untrained_classifier_defaults_to_imagenet_labels():
    m = LibreYOLO.new("resnet", "18", device="cpu")
    assert m.nc == 1000 and m.names[0] == "tench" and m.names[999] == "toilet tissue"
    assert LibreYOLO.new("resnet", "18", nc=3, device="cpu").names == {0: "class0", 1: "class1", 2: "class2"}
    assert LibreYOLO.new("segformer", "b0", device="cpu").nc == 150
    assert LibreYOLO.new("yolox", "n", device="cpu").names[0] == "person"
