"""The panoptic task: the merge of query classes and masks, PanopticSegmentation, the datasets and
the built-in set, PQ through torchmetrics, training (a small EoMT, two epochs, PQ above the
untrained model's), the command line and bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.models.eomt.model import Eomt
from libreyolo.models.eomt.nn import EomtConfig
from libreyolo.tasks.panoptic.data import PanopticDataset, collate_panoptic, read_segments, resolve_panoptic_data
from libreyolo.tasks.panoptic.merge import merge, query_scores
from libreyolo.tasks.panoptic.metrics import PanopticEvaluator, target_pairs
from libreyolo.tasks.panoptic.results import PanopticSegmentation, id_to_rgb
from libreyolo.tasks.panoptic.synthetic import SHAPES_PANOPTIC_NAMES, make_shapes_panoptic_dataset
from libreyolo.tasks.panoptic.task import PanopticOptions, thing_ids

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

SMALL = EomtConfig(96, 4, 3, 2, queries=16)


def _merge(probs, score, label, kept, stuff, **kw):
    p = torch.as_tensor(probs, dtype=torch.float32)
    return merge(torch.tensor(score), torch.tensor(label), torch.tensor(kept), lambda s, e: p[s:e], tuple(p.shape[1:]),
                 torch.tensor(stuff), mask_thresh=kw.get("mask_thresh", 0.5), overlap=kw.get("overlap", 0.8),
                 chunk=kw.get("chunk", 2))


def test_merge_things_stuff_overlap_and_void():
    """4x4 image, classes 0 (thing), 1 and 2 (stuff): two thing queries, two queries of stuff 1
    (fused into one segment), one stuff-2 query mostly hidden (dropped), one query not kept."""
    z = np.zeros((6, 4, 4), np.float32)
    z[0, 0, :2] = 0.9        # thing A: top-left pair
    z[1, 0, 2:] = 0.9        # thing B: top-right pair
    z[2, 1] = 0.9            # stuff 1, row 1
    z[3, 2] = 0.9            # stuff 1, row 2 (the same segment as query 2)
    z[4, 1:3] = 0.6          # stuff 2 under the stuff-1 rows: wins nothing there -> dropped
    z[4, 3, 0] = 0.6
    z[5] = 0.99              # not kept: never wins
    m = _merge(z, [0.9, 0.9, 0.9, 0.9, 0.9, 0.95], [0, 0, 1, 1, 2, 0], [True] * 5 + [False], [False, True, True])
    ids = m.ids.numpy()
    assert ids[0].tolist() == [1, 1, 2, 2] and ids[1].tolist() == [3] * 4 and ids[2].tolist() == [3] * 4
    assert ids[3].tolist() == [0, 0, 0, 0]   # query 4 won 1 of its 9 pixels: under the overlap share
    assert m.segment.tolist() == [1, 2, 3, 3, 0, 0] and m.start.tolist() == [True, True, True, False, False, False]
    assert m.area.tolist() == [2, 2, 8, 0, 0, 0]
    assert m.category[0].tolist() == [0, 0, 0, 0] and m.category[3].tolist() == [3, 3, 3, 3]   # void = nc
    # the same with every query map at once (the chunked running winner changes nothing)
    m1 = _merge(z, [0.9, 0.9, 0.9, 0.9, 0.9, 0.95], [0, 0, 1, 1, 2, 0], [True] * 5 + [False], [False, True, True],
                chunk=32)
    assert torch.equal(m1.ids, m.ids)
    # a lower overlap share keeps query 4's one pixel
    m2 = _merge(z, [0.9, 0.9, 0.9, 0.9, 0.9, 0.95], [0, 0, 1, 1, 2, 0], [True] * 5 + [False], [False, True, True],
                overlap=0.05)
    assert m2.ids[3, 0] == 4


def test_query_scores_exclude_no_object_and_low_scores():
    logits = torch.tensor([[[5.0, 0, 0], [0, 0, 5.0], [0.1, 0, 0]]])
    score, label, kept = query_scores(logits, 0.5)
    assert label.tolist() == [[0, 2, 0]] and kept.tolist() == [[True, False, False]]


def test_panoptic_segmentation_result():
    ids = np.zeros((20, 30), np.int32)
    ids[:10] = 1
    ids[12:, 5:15] = 2
    segs = [{"id": 1, "class": 6, "isthing": False, "score": 0.9, "area": 300},
            {"id": 2, "class": 0, "isthing": True, "score": 0.8, "area": 80}]
    p = PanopticSegmentation(torch.from_numpy(ids), segs)
    assert len(p) == 2 and p.shape == (20, 30)
    cm = p.class_map()
    assert cm[0, 0] == 6 and cm[15, 10] == 0 and cm[11, 0] == -1
    names = dict(enumerate(SHAPES_PANOPTIC_NAMES))
    assert p.summary(names)[1] == {"id": 2, "name": "triangle", "class": 0, "isthing": True, "score": 0.8, "area": 80}
    img = np.full((20, 30, 3), 40, np.uint8)
    out = p.plot_on(img, names)
    assert out.shape == img.shape and not np.array_equal(out, img)
    assert p.numpy().segments == segs and isinstance(p.numpy().data, np.ndarray)
    assert id_to_rgb(np.array([[0, 1, 256 + 2]]))[0].tolist() == [[0, 0, 0], [1, 0, 0], [2, 1, 0]]
    with pytest.raises(ValueError, match="integer segment ids"):
        PanopticSegmentation(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="does not match"):
        p.plot_on(np.zeros((5, 5, 3), np.uint8), names)


def test_results_panoptic_plot_save_json(tmp_path):
    from libreyolo.results import Results
    ids = np.zeros((20, 30), np.int32)
    ids[5:15, 5:15] = 1
    r = Results(np.zeros((20, 30, 3), np.uint8), "img.jpg", {0: "triangle"},
                panoptic=PanopticSegmentation(ids, [{"id": 1, "class": 0, "isthing": True, "score": 0.5, "area": 100}]))
    assert json.loads(r.to_json())[0]["name"] == "triangle"
    assert Image.open(r.save(tmp_path / "p.png")).size == (30, 20)
    assert Image.open(r.panoptic.save_png(tmp_path / "ids.png")).getpixel((10, 10)) == (1, 0, 0)
    assert r.cpu().panoptic.segments == r.panoptic.segments


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_shapes_panoptic_dataset(tmp_path_factory.mktemp("pan") / "ds", n_train=48, n_val=12, imgsz=64)


def test_builtin_set_layout_and_samples(shapes):
    data = resolve_panoptic_data(str(shapes))
    assert data.nc == 8 and data.things == [0, 1, 2, 3, 4] and len(data.train) == 48 and len(data.val) == 12
    index, cls = read_segments(data.train[0], data.nc, set(data.things))
    assert index.min() >= 0 and cls.tolist().count(5) == 1   # every pixel labelled; one sky segment
    assert sum(c < 5 for c in cls) >= 1                        # and at least one thing
    m = Eomt.custom(SMALL, nc=8, imgsz=64, device="cpu", task="panoptic")
    ds = PanopticDataset(data.val, 64, data.nc, data.things, m.preprocess)
    img, c, masks = ds[0]
    assert img.shape == (3, 64, 64) and img.dtype == torch.uint8 and masks.shape == (len(c), 16, 16)
    batch = collate_panoptic([ds[0], ds[1]])
    assert batch[1].shape[1] == 16 and batch[2].sum() == len(ds[0][1]) + len(ds[1][1])
    t = target_pairs(batch[1], batch[2], batch[3], 8)
    assert t.shape == (2, 16, 16, 2)


def test_bad_labels_are_reported_by_file(tmp_path, shapes):
    import shutil
    root = tmp_path / "bad"
    shutil.copytree(shapes.parent, root)
    png = sorted((root / "panoptic" / "train").glob("*.png"))[0]
    arr = np.asarray(Image.open(png)).copy()
    arr[0, 0] = (7, 3, 0)   # class 6 (ground: stuff) with an instance id
    Image.fromarray(arr).save(png)
    from libreyolo.tasks.panoptic.data import check_samples
    with pytest.raises(ValueError, match=f"{png.name}.*stuff classes \\[6\\] carry instance ids"):
        check_samples(resolve_panoptic_data(str(root / "data.yaml")))
    with pytest.raises(FileNotFoundError):
        resolve_panoptic_data(str(tmp_path / "missing.yaml"))


def test_evaluator_perfect_prediction_scores_one(shapes):
    data = resolve_panoptic_data(str(shapes))
    m = Eomt.custom(SMALL, nc=8, imgsz=64, device="cpu", task="panoptic")
    m.meta["thing_class_ids"] = data.things
    ev = PanopticEvaluator(m, PanopticOptions(), thing_ids(m))
    ds = PanopticDataset(data.val, 64, data.nc, data.things, m.preprocess)
    batch = collate_panoptic([ds[i] for i in range(4)])
    target = target_pairs(batch[1], batch[2], batch[3], 8)
    ev.process(target, batch)
    r = ev.evaluate()
    assert r["pq"] == pytest.approx(1.0) and r["sq"] == pytest.approx(1.0) and r["rq"] == pytest.approx(1.0)


def test_thing_ids_sources():
    m = Eomt.custom(SMALL, nc=133, imgsz=64, device="cpu", task="panoptic")
    assert thing_ids(m) == list(range(80)) and m.names[80] == "banner"
    m.meta["thing_class_ids"] = "[1, 2]"     # an ONNX export's metadata
    assert thing_ids(m) == [1, 2]


def test_predict_options_are_checked():
    m = Eomt.custom(SMALL, nc=8, imgsz=64, device="cpu", task="panoptic")
    from libreyolo import SAMPLE_IMAGE
    with pytest.raises(ValueError, match="threshold"):
        m(SAMPLE_IMAGE, threshold=2)
    with pytest.raises(TypeError, match="unknown predict option"):
        m(SAMPLE_IMAGE, conf=0.3)


def test_train_two_epochs_beats_untrained_and_predicts_from_cli(tmp_path, shapes, capsys):
    """A small EoMT (96 wide, 4 blocks: EoMT-S trains at seconds per step on one core) on the
    built-in set: two epochs, then PQ above the untrained model's at the same thresholds; the
    trained best.pt predicts through ``libreyolo predict``."""
    m = Eomt.custom(SMALL, nc=8, imgsz=64, device="cpu", seed=0, task="panoptic")
    opts = {"batch": 4, "workers": 0, "val_conf": 0.15}
    before = m.val(data=str(shapes), **opts)
    out = m.train(data=str(shapes), epochs=2, imgsz=64, project=tmp_path, plots=False, verbose=False, lr0=1e-3,
                  warmup_epochs=0, clip_grad=1.0, seed=0, **opts)
    after = m.val(data=str(shapes), **opts)
    assert out["epochs"] == 2 and after["pq"] > before["pq"], (before, after)
    assert m.meta["thing_class_ids"] == [0, 1, 2, 3, 4]
    from libreyolo.cli import main
    img = sorted((shapes.parent / "images" / "val").glob("*.jpg"))[0]
    save = tmp_path / "pred"
    assert main(["predict", f"model={m.ckpt_path}", f"source={img}", "threshold=0.15", "save=true",
                 f"save_dir={save}", "cuda_graph=false"]) == 0
    assert list(save.glob("*.jpg"))
    r = LibreYOLO(m.ckpt_path, device="cpu")(str(img), threshold=0.15)
    assert r.panoptic.shape == Image.open(img).size[::-1]
