"""Training conveniences on the CPU: patience (early stopping), freeze, save_period, val=False,
val(save_json=True) and loggers=tensorboard; their validation and their CLI spellings."""
import csv
import json
import logging
import math
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.cli import main
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine import hooks as H
from libreyolo.engine import optim as O
from libreyolo.options import OptionError
from libreyolo.tasks.detect.task import DetectionEvaluator
from libreyolo.weights import load_checkpoint


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("opts") / "ds", n_train=8, n_val=4, imgsz=64, seed=0))


def run(tmp_path, data, family="yolox", size="n", **kw):
    args = dict(data=data, epochs=2, batch=8, imgsz=64, workers=0, project=str(tmp_path), name="run",
                warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, seed=0)
    model = LibreYOLO.new(family, size, nc=5, device="cpu", seed=0)
    return model, model.train(**{**args, **kw})


def test_patience_stops_at_the_right_epoch_with_one_line(data, tmp_path, monkeypatch, caplog):
    """Fitness per epoch 0.1, 0.3, 0.2, 0.25, ... with patience=2: epoch 2 is the best, epochs 3
    and 4 do not beat it, the run stops after epoch 4 of 6 and says why once."""
    forced = iter([0.1, 0.3, 0.2, 0.25, 0.29, 0.5])

    def validate(self, net, loader, progress=False, **kw):   # kw: loss_fn (the validation losses)
        v = next(forced)
        return {"map50": v, "map50_95": v, "precision": 0.0, "recall": 0.0, "per_class": {}}

    monkeypatch.setattr(H.EvaluationHook, "validate", validate)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        _, res = run(tmp_path, data, epochs=6, patience=2)
    assert res["epochs"] == 4 and res["best_epoch"] == 2 and math.isclose(res["best_fitness"], 0.3)
    lines = [m for m in caplog.messages if "early stopping" in m]
    assert len(lines) == 1 and "after epoch 4/6" in lines[0] and "epoch 2" in lines[0] and "patience=2" in lines[0]
    assert res["stop_reason"] == lines[0]
    assert load_checkpoint(res["best"])["train_metrics"]["map50_95"] == 0.3
    assert load_checkpoint(res["last"])["train_state"]["epoch"] == 3


def test_freeze_first_layers_keeps_them_bitwise_and_out_of_the_optimizer(data, tmp_path):
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    flags = {n: p.requires_grad for n, p in model.model.named_parameters()}
    frozen = O.layers(model.model)[:3]
    assert frozen == ["backbone.conv0", "backbone.conv1", "backbone.elan1"]
    res = model.train(data=data, epochs=2, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="run",
                      warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, seed=0, freeze=3)
    ck = load_checkpoint(res["last"])
    keys = [k for k in before if O.under(k, frozen)]
    assert any("running_mean" in k for k in keys)          # BatchNorm statistics included
    for sd in (ck["model"], ck["train_state"]["model_raw"]):   # EMA and raw weights
        assert all(torch.equal(sd[k], before[k]) for k in keys), [k for k in keys if not torch.equal(sd[k], before[k])]
    moved = [k for k in before if not O.under(k, frozen) and before[k].is_floating_point()
             and not torch.equal(ck["train_state"]["model_raw"][k], before[k])]
    assert moved                                            # the rest trained
    in_opt = sum(len(g["params"]) for g in ck["train_state"]["optimizer"]["param_groups"])
    trainable = [n for n, p in model.model.named_parameters() if not O.under(n, frozen) and flags[n]]
    assert in_opt == len(trainable) and ck["train_state"]["freeze"] == frozen
    assert {n: p.requires_grad for n, p in model.model.named_parameters()} == flags   # frozen for that run only


def test_freeze_by_prefix_and_bad_freeze_values(data, tmp_path):
    net = LibreYOLO.new("yolox", "n", nc=5, device="cpu").model
    assert O.freeze_prefixes(net, ["head.stems"]) == ["head.stems"]
    with pytest.raises(OptionError, match=r"freeze=999 but this network has \d+ layers \(backbone.backbone"):
        O.freeze_prefixes(net, 999)
    with pytest.raises(OptionError, match="'nope' names no parameter of this network"):
        O.freeze_prefixes(net, ["nope"])
    _, res = run(tmp_path, data, epochs=1, freeze="backbone")   # the whole backbone part, as CLI text
    assert load_checkpoint(res["last"])["train_state"]["freeze"] == ["backbone"]


def test_val_false_runs_no_evaluator_best_follows_last_and_save_period(data, tmp_path, monkeypatch):
    def no_evaluator(*a, **k):
        raise AssertionError("val=False must not build an evaluator")

    monkeypatch.setattr(type(LibreYOLO.new("yolox", "n", device="cpu").task_def), "evaluator", no_evaluator)
    _, res = run(tmp_path, data, epochs=4, val=False, save_period=2)
    weights = tmp_path / "run" / "weights"
    assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "epoch2.pt", "epoch4.pt", "last.pt"]
    assert load_checkpoint(weights / "epoch2.pt")["train_state"]["epoch"] == 1    # resumable snapshot
    best, last = load_checkpoint(res["best"]), load_checkpoint(res["last"])
    assert all(torch.equal(v, last["model"][k]) for k, v in best["model"].items())   # best.pt = last epoch
    assert res["best_epoch"] == 4 and res["best_metrics"] == {}
    rows = list(csv.DictReader((tmp_path / "run" / "results.csv").open()))
    assert [r["epoch"] for r in rows] == ["1", "2", "3", "4"] and rows[0]["metrics/mAP50-95"] == "nan"


def test_new_options_are_validated_with_name_value_and_range(data):
    model = LibreYOLO.new("yolox", "n", nc=5, device="cpu")
    for kw, msg in [({"patience": -1}, "patience must be an integer >= 0, got -1"),
                    ({"save_period": "x"}, "save_period must be an integer >= 0, got 'x'"),
                    ({"freeze": 2.5}, "freeze must be an integer >= 0 .* got 2.5"),
                    ({"loggers": "neptune"}, "loggers must be one of tensorboard, mlflow, wandb, comet, clearml, dvclive, got 'neptune'"),
                    ({"patience": 3, "val": False}, "patience=3 needs validation")]:
        with pytest.raises(OptionError, match=msg):
            model.train(data=data, epochs=1, **kw)
    with pytest.raises(ValueError, match="save_json must be true or false"):
        model.val(data=data, save_json="maybe")


def test_tensorboard_events_hold_losses_metrics_lr_and_images(data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    _, res = run(tmp_path, data, epochs=2, loggers="tensorboard")
    acc = EventAccumulator(res["run_dir"], size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    scalars, images = set(acc.Tags()["scalars"]), set(acc.Tags()["images"])
    assert {"train/iou_loss", "metrics/mAP50-95", "lr/pg0", "lr/pg1", "lr/pg2"} <= scalars, scalars
    assert [e.step for e in acc.Scalars("lr/pg0")] == [1, 2]
    assert [round(e.value, 6) for e in acc.Scalars("train/iou_loss")] == \
        [round(v, 6) for v in (h["train/iou_loss"] for h in res["history"])]
    assert {"val/image0", "val/image3"} <= images
    shot = acc.Images("val/image0")[-1]
    assert (shot.width, shot.height) == (64, 64) and shot.step == 2


def test_tensorboard_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)   # as if not installed
    with pytest.raises(ImportError, match="loggers=tensorboard needs the tensorboard package: pip install"):
        LibreYOLO.new("yolox", "n", device="cpu").train(data="nowhere", loggers="tensorboard")   # before the data


def coco_dataset(root):
    """A small COCO json dataset: 6 non-square images (96 x 72) with rectangles, image ids from
    100 and non-contiguous category ids 3 and 7."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    images, anns = [], []
    for i in range(6):
        arr = np.full((72, 96, 3), 114, np.uint8)
        for _ in range(2):
            x, y = int(rng.integers(0, 60)), int(rng.integers(0, 40))
            w, h = int(rng.integers(12, 30)), int(rng.integers(12, 28))
            cat = int(rng.choice([3, 7]))
            arr[y:y + h, x:x + w] = (200, 30, 30) if cat == 3 else (30, 30, 200)
            anns.append({"id": len(anns) + 1, "image_id": 100 + i, "category_id": cat, "bbox": [x, y, w, h],
                         "area": w * h, "iscrowd": 0})
        Image.fromarray(arr).save(root / "images" / f"im{i}.png")
        images.append({"id": 100 + i, "file_name": f"im{i}.png", "width": 96, "height": 72})
    doc = {"images": images, "annotations": anns,
           "categories": [{"id": 3, "name": "red"}, {"id": 7, "name": "blue"}]}
    (root / "ann.json").write_text(json.dumps(doc))
    (root / "data.yaml").write_text("format: coco\npath: .\ntrain: {images: images, annotations: ann.json}\n"
                                    "val: {images: images, annotations: ann.json}\n")
    return root / "data.yaml", root / "ann.json"


def test_save_json_writes_coco_results_that_faster_coco_eval_scores_alike(tmp_path, monkeypatch):
    """The evaluator is fed the ground truth, jittered and with scores, as its detections; the
    COCO results it writes (boxes mapped back to the 96 x 72 images, the json's image and
    category ids) score the same mAP in faster-coco-eval against the original json as val does."""
    from faster_coco_eval import COCO, COCOeval_faster
    yaml_path, ann = coco_dataset(tmp_path / "coco")
    rng = np.random.default_rng(1)
    real_process = DetectionEvaluator.process

    def process(self, outputs, batch):
        real_process(self, outputs, batch)
        imgs, targets, mask = batch
        for i in range(targets.shape[0]):
            gt = targets[i][mask[i]].numpy()
            jitter = rng.normal(0, 1.5, (len(gt), 4)).astype(np.float32)
            self.preds[len(self.preds) - targets.shape[0] + i] = np.concatenate(
                [gt[:, 1:5] + jitter, rng.uniform(0.3, 1, (len(gt), 1)), gt[:, :1]], 1).astype(np.float32)

    monkeypatch.setattr(DetectionEvaluator, "process", process)
    model = LibreYOLO.new("yolox", "n", nc=2, device="cpu", seed=0)
    metrics = model.val(data=str(yaml_path), imgsz=64, batch=4, workers=0, save_json=True, save_dir=tmp_path / "v")
    path = tmp_path / "v" / "predictions.json"
    assert metrics["predictions_json"] == str(path)
    dets = json.loads(path.read_text())
    assert {d["image_id"] for d in dets} == set(range(100, 106)) and {d["category_id"] for d in dets} == {3, 7}
    assert all(set(d) == {"image_id", "category_id", "bbox", "score"} and len(d["bbox"]) == 4 for d in dets)
    gt = COCO(str(ann))
    ev = COCOeval_faster(gt, gt.loadRes(str(path)), iouType="bbox", print_function=lambda *a, **k: None)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert 0.2 < metrics["map50_95"] < 0.95                     # jittered: neither 0 nor perfect
    assert abs(ev.stats[0] - metrics["map50_95"]) < 0.02 and abs(ev.stats[1] - metrics["map50"]) < 0.02, \
        (ev.stats[:2], metrics["map50_95"], metrics["map50"])


def test_save_json_for_a_task_without_coco_results_is_refused():
    model = LibreYOLO.new("resnet", "18", nc=3, device="cpu")
    with pytest.raises(ValueError, match="save_json=True writes COCO detection results; the classify task"):
        model.val(data="shapes-cls", save_json=True)


def test_cli_train_takes_the_new_options_and_lists_them(data, tmp_path, capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(k in out for k in ("patience", "freeze", "save_period", "loggers", "val "))
    assert main(["val", "--help"]) == 0 and "save_json" in capsys.readouterr().out
    assert main(["train", "patience=-1"]) == 2
    assert "patience must be an integer >= 0, got '-1'" in capsys.readouterr().err
    code = main(["train", "model=yolox-n", f"data={data}", "epochs=1", "imgsz=64", "batch=8", "workers=0",
                 f"project={tmp_path}", "name=cli", "freeze=3", "save_period=1", "loggers=tensorboard", "patience=5",
                 "seed=0"])
    assert code == 0, capsys.readouterr()
    run_dir = tmp_path / "cli"
    assert (run_dir / "weights" / "epoch1.pt").is_file() and list(run_dir.glob("events.out.tfevents.*"))
    assert load_checkpoint(run_dir / "weights" / "last.pt")["train_state"]["freeze"] == \
        ["backbone.backbone", "backbone.lateral_conv0", "backbone.C3_p4"]
