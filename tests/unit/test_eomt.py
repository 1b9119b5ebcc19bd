"""EoMT: the network's layout and forward on small configurations (the full-size fixtures are the
slow rows of test_fixtures.py), each head through its task's predict, checkpoints, the fixed input
size, the mask-annealing schedule, the loss, ONNX export and the semantic / segment training glue.

Small configurations (``Eomt.custom``): EoMT-S at a 640 input takes seconds per forward on one
core, so these tests build 64-wide, 3-block networks that run in milliseconds."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.models.eomt.loss import EomtLoss, anneal_probs, hungarian_match
from libreyolo.models.eomt.model import Eomt, EomtPanoptic, EomtSeg, mask_boxes
from libreyolo.models.eomt.nn import CONFIGS, EomtConfig, EomtNet, semantic_scores
from libreyolo.models.registry import get_family, parse_spec

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

SMALL = EomtConfig(64, 3, 2, 2, queries=12)


def small(task: str, nc: int, imgsz: int = 64, seed: int = 0):
    return Eomt.custom(SMALL, nc=nc, imgsz=imgsz, device="cpu", seed=seed, task=task)


def test_registry_names_and_task_variants():
    assert get_family("eomt") is Eomt
    assert Eomt.for_task("segment") is EomtSeg and Eomt.for_task("panoptic") is EomtPanoptic
    assert EomtSeg.for_task("semantic") is Eomt and EomtPanoptic.for_task("segment") is EomtSeg
    assert parse_spec("LibreEoMTs.pt") == (Eomt, "s")
    assert parse_spec("LibreEoMTl-seg.pt") == (EomtSeg, "l")
    assert parse_spec("LibreEoMTb-panoptic.pt") == (EomtPanoptic, "b")
    with pytest.raises(ValueError, match="serves the tasks semantic, segment, panoptic"):
        Eomt.for_task("pose")


@pytest.mark.parametrize("size", ["s", "b", "l"])
def test_sizes_build_the_hf_layout(size):
    """b and l: DINOv2's ViT-B / ViT-L widths and depths, the query blocks of the EoMT releases."""
    with torch.device("meta"):
        net = EomtNet(CONFIGS[size], 133, 640)
    sd = net.state_dict()
    cfg = CONFIGS[size]
    assert sd["query.weight"].shape == (100, cfg.dim) and sd["attn_mask_probs"].shape == (cfg.blocks,)
    assert sd["embeddings.position_embeddings.weight"].shape == (1600, cfg.dim)
    assert f"layers.{cfg.depth - 1}.mlp.fc2.weight" in sd and f"layers.{cfg.depth}.norm1.weight" not in sd
    assert sd["class_predictor.weight"].shape == (134, cfg.dim) and sd["criterion.empty_weight"].shape == (134,)
    assert list(sd)[:2] == ["attn_mask_probs", "embeddings.cls_token"] and list(sd)[-1] == "criterion.empty_weight"


def test_forward_outputs_and_raw_parts_agree():
    torch.manual_seed(0)
    net = EomtNet(SMALL, 5, 64).eval()
    net.set_mask_probs([0.0, 0.0])
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        out, p = net(x), net(x, raw=True)
    assert out["class_queries_logits"].shape == (2, 12, 6)
    assert out["masks_queries_logits"].shape == (2, 12, 64, 64) and p.feature.shape == (2, 64, 16, 16)
    up = F.interpolate(p.mask_logits, size=(64, 64), mode="bilinear", align_corners=False)
    assert torch.equal(out["masks_queries_logits"], up)
    assert torch.allclose(out["semantic_logits"], semantic_scores(p.class_logits, up))
    assert p.aux == []   # annealed: no intermediate predictions in eval
    net.train()
    tr = net(x)
    assert tr["pred_masks"].shape == (2, 12, 16, 16) and len(tr["aux"]) == SMALL.blocks


def test_masked_attention_follows_the_schedule_and_its_host_copy():
    torch.manual_seed(0)
    net = EomtNet(SMALL, 5, 64).eval()
    x = torch.rand(1, 3, 64, 64)
    assert net.mask_active == [True, True]            # a fresh network masks (probability 1)
    with torch.no_grad():
        masked = net(x)["class_queries_logits"]
        net.set_mask_probs([0.0, 0.0])
        assert net.mask_active == [False, False]
        free = net(x)["class_queries_logits"]
    assert not torch.allclose(masked, free)
    other = EomtNet(SMALL, 5, 64)
    other.load_state_dict(net.state_dict())           # the load hook refreshes the host copy
    assert other.mask_active == [False, False]
    assert anneal_probs(3, 0, 10) == [1.0, 1.0, 1.0]
    assert anneal_probs(3, 10, 10) == [0.0, 0.0, 0.0]
    mid = anneal_probs(3, 5, 10)                       # blocks anneal one after another
    assert mid[0] == 0.0 and 0.0 < mid[1] < 1.0 and mid[2] == 1.0


def test_wrong_input_size_is_one_clear_error():
    net = EomtNet(SMALL, 5, 64)
    with pytest.raises(ValueError, match="takes 64x64 inputs"):
        net(torch.rand(1, 3, 96, 96))
    m = small("semantic", 5)
    for call in (lambda: m(SAMPLE_IMAGE, imgsz=96), lambda: m.val(data="shapes-seg", imgsz=96),
                 lambda: m.train(data="shapes-seg", imgsz=96), lambda: m.export(imgsz=96)):
        with pytest.raises(ValueError, match="fixed 64x64 input"):
            call()
    with pytest.raises(ValueError, match="dynamic=True"):
        m.export(dynamic=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        Eomt.new("s", imgsz=100)


def test_mask_boxes_around_the_stride4_cells():
    fg = torch.zeros(1, 2, 8, 8, dtype=torch.bool)
    fg[0, 0, 2:4, 1:6] = True
    assert mask_boxes(fg)[0].tolist() == [[4.0, 8.0, 24.0, 16.0], [0.0, 0.0, 0.0, 0.0]]


def test_each_head_predicts_through_its_task():
    sem = small("semantic", 6)(SAMPLE_IMAGE)
    assert sem.masks.shape == (720, 1280) and int(sem.masks.data.max()) < 6
    seg = small("segment", 5)(SAMPLE_IMAGE, conf=0.0)
    assert len(seg.boxes) == SMALL.queries and seg.masks.shape == (SMALL.queries, 720, 1280)
    pan_model = small("panoptic", 8)
    pan_model.meta["thing_class_ids"] = [0, 1, 2]
    pan = pan_model(SAMPLE_IMAGE, threshold=0.05)
    assert pan.panoptic is not None and pan.panoptic.shape == (720, 1280)
    ids = np.unique(np.asarray(pan.panoptic.data))
    assert set(ids.tolist()) <= {0} | {s["id"] for s in pan.panoptic.segments}


def test_custom_checkpoint_round_trip_keeps_task_config_and_things(tmp_path):
    m = small("panoptic", 8)
    m.meta["thing_class_ids"] = [0, 1]
    path = m.save(tmp_path / "pan.pt")
    back = LibreYOLO(str(path), device="cpu")
    assert type(back) is EomtPanoptic and back.size == "custom" and back.meta["thing_class_ids"] == [0, 1]
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        a, b = m.infer(x), back.infer(x)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("nc,task", [(80, EomtSeg), (133, EomtPanoptic), (150, Eomt), (19, Eomt)])
def test_bare_state_dict_task_from_its_class_count(tmp_path, nc, task):
    torch.manual_seed(0)
    net = EomtNet(CONFIGS["s"], nc, 32)
    path = tmp_path / "anonymous.pt"
    torch.save({"model": net.state_dict()}, path)
    m = LibreYOLO(str(path), device="cpu")
    assert type(m) is task and (m.size, m.nc, m.imgsz) == ("s", nc, 32)


def test_checkpoint_task_field_picks_the_variant_and_refuses_others(tmp_path):
    m = small("segment", 80)
    ck = m.checkpoint()
    assert ck["task"] == "segment"
    assert type(Eomt.from_checkpoint({**ck, "task": "panoptic"})) is EomtPanoptic
    with pytest.raises(ValueError, match="serves semantic, segment, panoptic"):
        Eomt.from_checkpoint({**ck, "task": "pose"})


def test_hungarian_match_and_loss_prefer_the_right_query():
    masks = torch.zeros(2, 8, 8)
    masks[0, :4], masks[1, 4:] = 1, 1
    logits = torch.full((3, 8, 8), -8.0)
    logits[2, 4:] = 8.0          # query 2 draws segment 1
    logits[0, :4] = 8.0          # query 0 draws segment 0
    cls = torch.zeros(3, 4)
    cls[0, 1] = cls[2, 2] = 5.0
    qi, ti = hungarian_match(cls, logits, torch.tensor([1, 2]), masks)
    assert dict(zip(qi.tolist(), ti.tolist())) == {0: 0, 2: 1}
    loss = EomtLoss("panoptic", 3, torch.tensor([1.0, 1.0, 1.0, 0.1]), 2)
    out = {"pred_logits": cls[None].requires_grad_(), "pred_masks": logits[None].requires_grad_(), "aux": []}
    total, items = loss(out, torch.tensor([[1, 2]]), torch.tensor([[True, True]]), masks[None])
    assert torch.isfinite(total) and items.shape == (3,) and items[1] < 0.05 and items[2] < 0.05
    total.backward()
    # semantic targets: each class present is one segment, ignored pixels left out
    sem = EomtLoss("semantic", 3, torch.tensor([1.0, 1.0, 1.0, 0.1]), 2)
    maps = torch.full((1, 32, 32), -1, dtype=torch.long)
    maps[0, :16], maps[0, 16:24] = 1, 2
    t, _ = sem({"pred_logits": cls[None], "pred_masks": logits[None]}, maps)
    assert torch.isfinite(t)


@pytest.mark.parametrize("task,nc,kw", [("semantic", 6, {}), ("segment", 5, {"conf": 0.0}),
                                       ("panoptic", 8, {"threshold": 0.05})])
def test_onnx_export_matches_eager_per_head(tmp_path, task, nc, kw):
    """Semantic and segment through the tasks' graphs; panoptic as the network's raw outputs
    (the merge runs after the graph, as after eager predict's stage)."""
    pytest.importorskip("onnxruntime")
    m = small(task, nc)
    if task == "panoptic":
        m.meta["thing_class_ids"] = [0, 1, 2, 3, 4]
    o = LibreYOLO(str(m.export(format="onnx", file=tmp_path / f"{task}.onnx")), device="cpu")
    a, b = m(SAMPLE_IMAGE, **kw), o(SAMPLE_IMAGE, **kw)
    if task == "semantic":
        assert torch.equal(torch.as_tensor(a.masks.data), torch.as_tensor(b.masks.data))
    elif task == "segment":
        assert len(a.boxes) == len(b.boxes)
        assert np.abs(a.boxes.conf.numpy() - b.boxes.conf.numpy()).max() < 1e-5
        same = (torch.as_tensor(a.masks.data) == torch.as_tensor(b.masks.data)).float().mean()
        assert same > 0.9999
    else:
        assert o.meta["thing_class_ids"] == "[0, 1, 2, 3, 4]"
        assert torch.equal(torch.as_tensor(a.panoptic.data), torch.as_tensor(b.panoptic.data))
        # every field exactly but the score, a float32 mean that onnxruntime sums in another order
        assert len(a.panoptic.segments) == len(b.panoptic.segments) > 0
        for sa, sb in zip(a.panoptic.segments, b.panoptic.segments):
            assert {k: v for k, v in sa.items() if k != "score"} == {k: v for k, v in sb.items() if k != "score"}
            assert abs(sa["score"] - sb["score"]) < 1e-5


@pytest.mark.parametrize("task,data", [("semantic", "shapes-seg"), ("segment", "shapes-inst")])
def test_semantic_and_segment_variants_train_and_validate(tmp_path, task, data):
    """One epoch on a few built-in images through the existing tasks' data and evaluators."""
    if task == "semantic":
        from libreyolo.tasks.semantic.synthetic import make_shapes_seg_dataset as make
        nc = 6
    else:
        from libreyolo.tasks.segment.data import make_shapes_inst_dataset as make
        nc = 5
    yaml = make(tmp_path / "ds", n_train=8, n_val=4, imgsz=64)
    m = small(task, nc)
    out = m.train(data=str(yaml), epochs=1, batch=4, imgsz=64, workers=0, project=tmp_path, plots=False,
                  verbose=False, lr0=1e-3, warmup_epochs=0)
    assert out["epochs"] == 1 and np.isfinite(out["losses"]).all()
    metrics = m.val(data=str(yaml), batch=4, workers=0)
    assert ("miou" if task == "semantic" else "mask_map50_95") in metrics
