"""Semantic segmentation on the CPU: predict, results, datasets and their checks, shapes-seg,
training and validation through the shared trainer, the evaluator's metrics."""
import csv
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import render_shapes, render_shapes_labelled
from libreyolo.ops.letterbox import image_region
from libreyolo.ops.preprocess import Preprocess
from libreyolo.tasks import get_task
from libreyolo.tasks.semantic import SemanticLoss, SemanticMask, SemanticOptions, metrics_from_confusion
from libreyolo.tasks.semantic.data import SemanticDataset, check_samples, collate_semantic, resolve_semantic_data
from libreyolo.tasks.semantic.maps import IGNORE, letterbox_mask, resize_nearest
from libreyolo.tasks.semantic.metrics import SemanticEvaluator, confusion_matrix
from libreyolo.tasks.semantic.synthetic import SHAPES_SEG_NAMES, make_shapes_seg_dataset

NC = 4


@pytest.fixture(scope="module")
def model():
    return LibreYOLO.new("segformer", "b0", nc=NC, device="cpu", seed=0)


def _image(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------ predict

def test_predict_end_to_end_maps_back_to_the_original_image(model, tmp_path):
    img = _image(50, 70, 0)
    r = model(img, imgsz=64, color_format="rgb")
    m = r.masks
    assert isinstance(m, SemanticMask) and r.boxes is None
    assert m.data.shape == (50, 70) and m.data.dtype == torch.uint8
    assert int(m.data.max()) < NC
    assert sum(m.counts.values()) == 50 * 70
    assert abs(sum(m.areas.values()) - 1.0) < 1e-9
    rows = json.loads(r.to_json())
    assert [row["class"] for row in rows] == list(m.areas)          # largest area first
    assert {"name", "class", "area"} <= set(rows[0]) and rows[0]["name"] == model.names[rows[0]["class"]]
    picture = r.plot()
    assert picture.shape == img.shape and not np.array_equal(picture, img)
    out = r.save(tmp_path / "seg.png")
    assert Image.open(out).size == (70, 50)
    # the class map is the network's argmax, its image region (letterboxed at the top-left, as
    # the reference does) resized back by nearest neighbour
    with torch.no_grad():
        logits = model.infer(model.preprocess(torch.from_numpy(img)[None], 64))
    region = image_region(logits.argmax(1)[0].to(torch.uint8), 50, 70, 64, model.preprocess.resize)
    ref = resize_nearest(region, 50, 70)
    assert torch.equal(m.data, ref)
    np_mask = r.numpy().masks
    assert isinstance(np_mask.data, np.ndarray) and np_mask.counts == m.counts


def test_mixed_size_batch_equals_one_by_one(model):
    images = [_image(50, 70, 1), _image(80, 40, 2), _image(64, 64, 3)]
    batched = model(images, imgsz=64, batch=3)
    for img, r in zip(images, batched):
        alone = model(img, imgsz=64)
        assert r.masks.shape == img.shape[:2]
        assert torch.equal(r.masks.data, alone.masks.data)


def test_letterbox_preprocess_cuts_the_padding_before_mapping_back():
    m = LibreYOLO.new("segformer", "b0", nc=3, device="cpu", seed=0)
    m.preprocess = Preprocess("center")
    img = _image(32, 64, 4)   # letterboxed into 64x64: rows 16..47 are the image
    r = m(img, imgsz=64, color_format="rgb")
    with torch.no_grad():
        cls = m.infer(m.preprocess(torch.from_numpy(img)[None], 64)).argmax(1)[0].to(torch.uint8)
    assert torch.equal(r.masks.data, resize_nearest(cls[16:48], 32, 64))
    m.preprocess = Preprocess("crop", crop_pct=0.875)
    with pytest.raises(ValueError, match="crop"):
        m(img, imgsz=64)


def test_resize_nearest_is_nearest_exact_for_any_integer_dtype():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, 200, (13, 29), generator=g, dtype=torch.uint8)
    for h, w in ((7, 5), (13, 29), (40, 61), (26, 58), (1, 1)):
        ref = F.interpolate(src[None, None], size=(h, w), mode="nearest-exact")[0, 0]
        assert torch.equal(resize_nearest(src, h, w), ref), (h, w)
        assert torch.equal(resize_nearest(src.to(torch.int64), h, w), ref.to(torch.int64))


def test_semantic_mask_summary_and_plot_legend():
    data = torch.zeros(120, 200, dtype=torch.uint8)
    data[:, 150:] = 2                    # a quarter is class 2
    mask = SemanticMask(data)
    assert mask.counts == {0: 18000, 2: 6000}
    assert mask.summary({0: "sky", 2: "road"}, 3) == [{"name": "sky", "class": 0, "area": 0.75},
                                                       {"name": "road", "class": 2, "area": 0.25}]
    img = np.full((120, 200, 3), 200, np.uint8)
    plain = mask.plot_on(img, {0: "sky", 2: "road"}, legend=False)
    assert tuple(plain[100, 180]) == tuple(np.rint(200 * 0.5 + np.array((240, 200, 20)) * 0.5).astype(np.uint8))
    with_legend = mask.plot_on(img, {0: "sky", 2: "road"})
    assert not np.array_equal(with_legend[:10, :20], plain[:10, :20])   # the legend panel
    assert np.array_equal(with_legend[60:], plain[60:])                 # the rest untouched
    with pytest.raises(ValueError, match="integer"):
        SemanticMask(torch.zeros(4, 4))


# ------------------------------------------------------------------------------------------ datasets

def _write(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _toy_dataset(root, masks, nc=3, extra=""):
    """images/{train,val}/<stem>.png with the given masks (None: no mask file) and a data.yaml."""
    for split, items in masks.items():
        for stem, (hw, mask) in items.items():
            _write(root / "images" / split / f"{stem}.png", _image(*hw, len(stem)))
            if mask is not None:
                _write(root / "masks" / split / f"{stem}.png", mask)
    names = ", ".join(f"c{i}" for i in range(nc))
    (root / "data.yaml").write_text(f"path: .\ntrain: images/train\nval: images/val\nnames: [{names}]\n{extra}")
    return root / "data.yaml"


def test_dataset_reader_pairs_masks_and_maps_ignore(tmp_path):
    mask = np.zeros((20, 30), np.uint8)
    mask[:, 10:] = 2
    mask[0] = 255
    yaml = _toy_dataset(tmp_path, {"train": {"a": ((20, 30), mask)}, "val": {"b": ((20, 30), mask)}})
    data = resolve_semantic_data(str(yaml))
    assert (data.nc, data.ignore_index, len(data.train), len(data.val)) == (3, 255, 1, 1)
    assert data.train[0].mask == tmp_path / "masks" / "train" / "a.png"
    check_samples(data)
    assert (tmp_path / ".libreyolo-semantic-train.cache").is_file()
    val = SemanticDataset(data.val, 32, data.ignore_index, "stretch")
    x, m = val[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.uint8 and m.shape == (32, 32) and m.dtype == torch.int64
    want = torch.from_numpy(np.where(mask == 255, IGNORE, mask.astype(np.int64)))
    assert torch.equal(m, resize_nearest(want, 32, 32))
    images, masks = collate_semantic([val[0], val[0]])
    assert images.shape == (2, 3, 32, 32) and masks.shape == (2, 32, 32)
    # a letterbox mode pads the mask with IGNORE where the image is padded
    lb = letterbox_mask(torch.zeros(20, 40, dtype=torch.int64), 40, "topleft")
    assert (lb[:20] == 0).all() and (lb[20:] == IGNORE).all()


def test_bad_masks_are_reported_together_naming_each_file(tmp_path):
    good = np.zeros((20, 30), np.uint8)
    bad_values = good.copy()
    bad_values[3, 3], bad_values[4, 4], bad_values[5, 5] = 7, 255, 3   # 7 and 3 >= nc=3; 255 is ignored
    yaml = _toy_dataset(tmp_path, {
        "train": {"sized": ((20, 30), np.zeros((18, 30), np.uint8)), "valued": ((20, 30), bad_values),
                  "missing": ((20, 30), None), "ok": ((20, 30), good)},
        "val": {"rgb": ((20, 30), np.zeros((20, 30, 3), np.uint8))},
    })
    data = resolve_semantic_data(yaml)
    with pytest.raises(ValueError) as exc:
        check_samples(data)
    msg = str(exc.value)
    assert "4 problems" in msg
    assert "masks/train/sized.png: mask is 30x18 but its image images/train/sized.png is 30x20" in msg
    assert "masks/train/valued.png: values 3, 7 are not class ids (nc=3)" in msg
    assert "images/train/missing.png: mask not found (expected masks/train/missing.png)" in msg
    assert "masks/val/rgb.png: mask is not single-channel" in msg
    assert not (tmp_path / ".libreyolo-semantic-train.cache").exists()
    # the same through training: the error comes before any epoch, from the task's datasets
    model = LibreYOLO.new("segformer", "b0", nc=3, device="cpu")
    with pytest.raises(ValueError, match="mask not found"):
        model.train(data=str(yaml), epochs=1, imgsz=32, workers=0, project=str(tmp_path / "runs"))


def test_structural_mistakes_name_the_key_and_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="shapes-seg"):
        resolve_semantic_data(tmp_path / "nope.yaml")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a, b]\n")
    with pytest.raises(FileNotFoundError, match="'train' image folder not found"):
        resolve_semantic_data(tmp_path)
    yaml = _toy_dataset(tmp_path / "x", {"train": {"a": ((8, 8), np.zeros((8, 8), np.uint8))},
                                         "val": {"b": ((8, 8), np.zeros((8, 8), np.uint8))}},
                        nc=2, extra="ignore_index: 1\n")
    with pytest.raises(ValueError, match="ignore_index 1 is a class id"):
        resolve_semantic_data(yaml)


def test_augmentation_keeps_image_and_mask_aligned(tmp_path):
    """Blocks of one flat colour per class: after random scale, crop and flip (no colour jitter)
    the image's colour under each mask pixel is its class's (boundary pixels aside)."""
    colors = np.array([(250, 0, 0), (0, 250, 0), (0, 0, 250)], np.uint8)
    mask = np.zeros((48, 80), np.uint8)
    mask[:, 20:50] = 1
    mask[30:, 60:] = 2
    root = tmp_path / "blocks"
    _write(root / "images" / "train" / "a.png", colors[mask])
    _write(root / "masks" / "train" / "a.png", mask)
    _write(root / "images" / "val" / "a.png", colors[mask])
    _write(root / "masks" / "val" / "a.png", mask)
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [r, g, b]\n")
    data = resolve_semantic_data(root / "data.yaml")
    train = SemanticDataset(data.train, 64, 255, "stretch", augment=True, scale=(0.5, 2.0), fliplr=0.5, color_jitter=0)
    torch.manual_seed(0)
    for _ in range(8):
        x, m = train[0]
        counted = m >= 0
        assert counted.float().mean() > 0.2
        want = torch.from_numpy(colors.astype(np.int64))[m[counted]]
        got = x.permute(1, 2, 0)[counted].to(torch.int64)
        assert ((got - want).abs().max(1).values < 60).float().mean() > 0.95
        assert (x.permute(1, 2, 0)[~counted] == 114).all()   # padding: grey image, ignored mask


def test_shapes_seg_is_deterministic_and_labels_every_pixel(tmp_path):
    a = make_shapes_seg_dataset(tmp_path / "a", n_train=3, n_val=2, imgsz=48, seed=0)
    b = make_shapes_seg_dataset(tmp_path / "b", n_train=3, n_val=2, imgsz=48, seed=0)
    assert (a.parent / "manifest.json").read_text() == (b.parent / "manifest.json").read_text()
    assert make_shapes_seg_dataset(tmp_path / "a", n_train=3, n_val=2, imgsz=48, seed=0) == a   # reused
    data = resolve_semantic_data(a)
    assert data.names == dict(enumerate(SHAPES_SEG_NAMES)) and data.nc == 6
    check_samples(data)
    rng = np.random.default_rng([0, 2, 0])   # train image 0's stream
    w, h = Image.open(data.train[0].image).size
    from libreyolo.data.builtin import image_size
    assert image_size(rng, 48) == (w, h)
    _, _, labels = render_shapes_labelled(rng, w, h)
    assert np.array_equal(np.asarray(Image.open(data.train[0].mask)), labels + 1)
    # render_shapes draws the same image as before the labelled variant existed
    img1, shapes1 = render_shapes(np.random.default_rng(5), 40, 30)
    img2, shapes2, labels2 = render_shapes_labelled(np.random.default_rng(5), 40, 30)
    assert np.array_equal(img1, img2) and shapes1 == shapes2
    for s in shapes2:
        x1, y1, x2, y2 = s.box
        assert (labels2[y1:y2, x1:x2] == s.cls).any()


def test_shapes_seg_by_name_goes_to_the_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_DATASETS_DIR", str(tmp_path))
    import libreyolo.tasks.semantic.synthetic as syn
    calls = []
    real = syn.make_shapes_seg_dataset
    monkeypatch.setattr(syn, "make_shapes_seg_dataset",
                        lambda: calls.append(1) or real(n_train=2, n_val=1, imgsz=32))
    data = get_task("semantic").resolve_data("shapes-seg")
    assert calls and data.source == "shapes-seg" and str(data.root).startswith(str(tmp_path))


# ------------------------------------------------------------------------------------ loss, metrics

def test_loss_averages_over_counted_pixels_only():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, 4, generator=g, requires_grad=True)
    masks = torch.randint(0, 3, (2, 4, 4), generator=g)
    masks[0, :2] = IGNORE
    loss, items = SemanticLoss()(logits, masks)
    keep = masks != IGNORE
    ref = F.cross_entropy(logits.permute(0, 2, 3, 1)[keep], masks[keep])
    assert torch.allclose(loss, ref) and items.shape == (1,) and SemanticLoss.item_names == ("ce",)
    loss.backward()
    assert logits.grad[0, :, :2].abs().sum() == 0
    empty, _ = SemanticLoss()(logits, torch.full((2, 4, 4), IGNORE))
    assert empty.item() == 0.0


def test_metrics_on_hand_made_confusions():
    names = {0: "bg", 1: "cat", 2: "dog"}
    perfect = metrics_from_confusion(np.diag([5, 3, 2]), names)
    assert perfect["miou"] == 1.0 and perfect["pixel_acc"] == 1.0
    # truth rows, prediction columns: 2 cat pixels read as bg, 1 bg pixel read as cat; no dog at all
    conf = np.array([[4, 1, 0], [2, 3, 0], [0, 0, 0]])
    m = metrics_from_confusion(conf, names)
    assert m["per_class"]["bg"] == pytest.approx(4 / 7) and m["per_class"]["cat"] == pytest.approx(3 / 6)
    assert np.isnan(m["per_class"]["dog"])          # neither in the truth nor predicted: left out
    assert m["miou"] == pytest.approx((4 / 7 + 3 / 6) / 2) and m["pixel_acc"] == pytest.approx(7 / 10)
    # a class predicted but absent from the truth counts, with IoU 0
    m = metrics_from_confusion(np.array([[1, 1], [0, 0]]), {0: "a", 1: "b"})
    assert m["per_class"] == {"a": 0.5, "b": 0.0} and m["miou"] == 0.25
    assert np.isnan(metrics_from_confusion(np.zeros((2, 2)), {0: "a", 1: "b"})["miou"])


def test_evaluator_confusion_excludes_ignored_pixels(model):
    pred = torch.tensor([[[0, 1], [1, 1]]])
    target = torch.tensor([[[0, 0], [IGNORE, 1]]])
    assert confusion_matrix(pred, target, 2).tolist() == [[1, 1], [0, 1]]
    ev = SemanticEvaluator(model)
    logits = F.one_hot(pred, NC).permute(0, 3, 1, 2).float()
    ev.process(logits, (None, target))
    ev.process(logits, (None, target))
    out = ev.evaluate()
    assert out["pixel_acc"] == pytest.approx(2 / 3)
    assert out["miou"] == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert set(out["per_class"]) == set(model.names.values())


# ------------------------------------------------------------------------------------------ training

def test_two_epoch_train_then_checkpoints_load_and_val(tmp_path):
    yaml = make_shapes_seg_dataset(tmp_path / "ds", n_train=8, n_val=4, imgsz=64, seed=0)
    model = LibreYOLO.new("segformer", "b0", nc=3, device="cpu", seed=0)   # rebuilt for 6 classes
    res = model.train(data=str(yaml), epochs=2, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="run",
                      plots=False, verbose=False)
    assert model.nc == 6 and model.names[0] == "background" and model.trained
    assert all(np.isfinite(loss[0]) for loss in res["losses"]) and res["loss_names"] == ["ce"]
    assert 0.0 <= res["miou"] <= 1.0 and 0.0 <= res["pixel_acc"] <= 1.0
    with open(tmp_path / "run" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and {"metrics/mIoU", "metrics/pixel_acc", "train/ce_loss", "val/ce_loss"} <= set(rows[0])
    assert all(np.isfinite(float(r["val/ce_loss"])) and float(r["val/ce_loss"]) > 0 for r in rows)
    for name in ("best.pt", "last.pt"):
        loaded = LibreYOLO(str(tmp_path / "run" / "weights" / name), device="cpu")
        assert (loaded.FAMILY, loaded.TASK, loaded.nc, loaded.imgsz) == ("segformer", "semantic", 6, 64)
        assert loaded.preprocess == model.preprocess
        r = loaded(_image(40, 50, 0))
        assert r.masks.shape == (40, 50)
    metrics = model.val(data=str(yaml), imgsz=64, batch=4, workers=0)
    assert {"miou", "pixel_acc", "per_class"} <= set(metrics) and 0.0 <= metrics["pixel_acc"] <= 1.0
    assert set(metrics["per_class"]) == set(SHAPES_SEG_NAMES)


def test_training_options_and_recipe():
    model = LibreYOLO.new("segformer", "b0", nc=6, device="cpu")
    d = model.train_defaults()
    assert d["optimizer"] == "AdamW" and d["warmup_bias_lr"] == 0.0 and d["lr0"] == model.SCRATCH_LR0
    model.trained = True
    assert model.train_defaults()["lr0"] == 6e-5
    with pytest.raises(ValueError, match="scale_min"):
        SemanticOptions(scale_min=2.0, scale_max=1.0).validate()
    with pytest.raises(TypeError, match="unknown training option"):
        model.train(data="shapes-seg", mosaic=1.0)
    with pytest.raises(TypeError, match="unknown predict option"):
        model(_image(8, 8, 0), conf=0.5)
