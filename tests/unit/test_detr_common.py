"""Block-level checks of the shared DETR code (detr_common) and the RT-DETR / RT-DETRv2 families."""
import json
import math

import pytest
import torch
from conftest import FIXTURES_DIR
from fill import fill_state_dict

from libreyolo.models.detr_common.deformable import MSDeformableAttention
from libreyolo.models.detr_common.hybrid_encoder import sincos_pos_embed_2d
from libreyolo.models.detr_common.model import IMAGENET, STRETCH, DetrModel, detr_postprocess
from libreyolo.models.detr_common.rtdetr_decoder import generate_anchors
from libreyolo.models.registry import FAMILIES, parse_spec
from libreyolo.models.rtdetr.model import RTDETR
from libreyolo.models.rtdetrv2.model import RTDETRv2
from libreyolo.ops.preprocess import Preprocess


def _fixture_net(cls, name):
    """The family's r18 network with the fixture's deterministic weights, in eval mode."""
    fx = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    pt = torch.load(FIXTURES_DIR / f"{name}.pt", weights_only=True)
    net = cls.build_network("r18", 80)
    net.load_state_dict(fill_state_dict(fx["layout"], constants=pt["constants"], tied=fx["tied"]))
    return net.eval(), pt["input"]


def test_sincos_embedding_token_order():
    """Token t of a w x h map is position (x = t // h, y = t % h), as in the reference."""
    w, h, dim = 3, 2, 8
    pe = sincos_pos_embed_2d(w, h, dim)
    assert pe.shape == (1, w * h, dim)
    f = [1.0, 1.0 / 100.0]                          # temperature 10000 ** (k / 2), k = 0, 1
    for t in range(w * h):
        x, y = t // h, t % h
        want = [math.sin(x * g) for g in f] + [math.cos(x * g) for g in f] + \
               [math.sin(y * g) for g in f] + [math.cos(y * g) for g in f]
        assert torch.allclose(pe[0, t], torch.tensor(want), atol=1e-6)


def test_anchors_are_logits_with_invalid_border_cells_at_inf():
    anchors, valid = generate_anchors([(80, 80), (40, 40), (20, 20)])
    assert anchors.shape == (1, 8400, 4) and valid.shape == (1, 8400, 1) and valid.dtype == torch.bool
    assert torch.isinf(anchors[~valid[..., 0]]).all() and torch.isfinite(anchors[valid[..., 0]]).all()
    assert not valid[0, 0]                          # the corner cell of level 0 is on the border
    assert torch.allclose(generate_anchors([(4, 4)])[0][0, 0].sigmoid(), torch.tensor([0.125, 0.125, 0.05, 0.05]))


def test_v2_stored_anchors_equal_generated_and_are_used_only_at_native_size():
    net = RTDETRv2.build_network("r18", 80).eval()
    dec = net.decoder
    gen, valid = generate_anchors(dec.native_shapes)
    assert torch.equal(dec.anchors, gen) and torch.equal(dec.valid_mask, valid)
    assert dec._anchors(dec.native_shapes, torch.device("cpu"))[0] is dec.anchors
    assert dec._anchors([(20, 20), (10, 10), (5, 5)], torch.device("cpu"))[0].shape == (1, 525, 4)


def test_deformable_attention_v1_and_v2_layouts_compute_the_same():
    torch.manual_seed(0)
    v1 = MSDeformableAttention(64, 4, 3, 4, store_points_scale=False)
    v2 = MSDeformableAttention(64, 4, 3, [4, 4, 4], store_points_scale=True)
    assert "num_points_scale" not in v1.state_dict() and "num_points_scale" in v2.state_dict()
    for p in v1.parameters():                       # break the symmetric reference init
        p.data.normal_(0, 0.1)
    v2.load_state_dict({**v1.state_dict(), "num_points_scale": v2.num_points_scale})
    shapes = [(8, 8), (4, 4), (2, 2)]
    q, mem = torch.randn(2, 5, 64), torch.randn(2, 84, 64)
    ref = torch.rand(2, 5, 1, 4) * 0.5 + 0.25
    assert torch.allclose(v1(q, ref, mem, shapes), v2(q, ref, mem, shapes), atol=1e-6)
    per_level = MSDeformableAttention(64, 4, 3, [2, 3, 4], store_points_scale=True)
    assert per_level(q, ref, mem, shapes).shape == (2, 5, 64)


def test_postprocess_is_the_rtdetr_topk_over_queries_and_classes():
    logits = torch.randn(2, 7, 3)
    boxes = torch.rand(2, 7, 4) * 0.5 + 0.25
    b, s, c = detr_postprocess(logits, boxes, 200, 100, num_top=300)
    assert b.shape == (2, 21, 4) and s.shape == (2, 21) and c.dtype == torch.int64   # K = min(300, 7 * 3)
    assert (s[:, :-1] >= s[:, 1:]).all()
    for i in range(2):
        for k in range(21):
            q = int(torch.nonzero(torch.isclose(logits[i].sigmoid(), s[i, k]))[0, 0])
            cx, cy, w, h = boxes[i, q].tolist()
            want = torch.tensor([(cx - w / 2) * 200, (cy - h / 2) * 100, (cx + w / 2) * 200, (cy + h / 2) * 100])
            assert torch.allclose(b[i, k], want, atol=1e-4)


def test_imagenet_input_norm_uses_scalar_math():
    x = torch.rand(2, 3, 4, 4)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    assert torch.allclose(IMAGENET.normalize(x), (x - mean[:, None, None]) / std[:, None, None], atol=1e-6)
    assert STRETCH.normalize(x) is x
    with pytest.raises(ValueError):
        Preprocess("stretch", mean=(0.5, 0.5, 0.5))   # mean without std


def test_detr_declarations():
    for cls in (RTDETR, RTDETRv2):
        assert issubclass(cls, DetrModel) and FAMILIES[cls.FAMILY] is cls
        assert cls.PREPROCESS == STRETCH and cls.NMS is False
        assert cls.SIZES == ("r18", "r34", "r50", "r101")
    assert parse_spec("LibreRTDETRr18.pt") == (RTDETR, "r18")
    assert parse_spec("LibreRTDETRv2r18.pt") == (RTDETRv2, "r18")
    assert parse_spec("rtdetrv2-r50") == (RTDETRv2, "r50") and parse_spec("rtdetr_r101") == (RTDETR, "r101")


@pytest.mark.parametrize("size,millions", [("r18", 20.18), ("r34", 31.44), ("r50", 42.94), ("r101", 76.66)])
def test_every_size_builds_with_the_published_parameter_count(size, millions):
    with torch.device("meta"):
        nets = [RTDETR.build_network(size, 80), RTDETRv2.build_network(size, 80)]
    for net in nets:
        assert round(sum(p.numel() for p in net.parameters()) / 1e6, 2) == millions
    v1, v2 = (n.state_dict() for n in nets)
    assert RTDETR.owns_state_dict(v1) and not RTDETR.owns_state_dict(v2)
    assert RTDETRv2.owns_state_dict(v2) and not RTDETRv2.owns_state_dict(v1)
    assert RTDETR.sniff_size(v1, 80) == size and RTDETRv2.sniff_size(v2, 80) == size


@pytest.mark.parametrize("cls,name", [(RTDETR, "rtdetr-r18"), (RTDETRv2, "rtdetrv2-r18")])
def test_batched_network_outputs_equal_one_by_one(cls, name):
    net, x = _fixture_net(cls, name)
    xs = torch.cat((x, 1 - x))
    with torch.no_grad():
        many = net(xs)
        for i in range(2):
            one = net(xs[i:i + 1])
            for k in ("pred_logits", "pred_boxes"):
                assert torch.allclose(one[k][0], many[k][i], atol=1e-4), k


def test_infer_small_and_non_default_sizes_keep_fixed_shapes():
    """96 px gives 189 encoder tokens (< 300 queries): the queries shrink to what exists."""
    m = RTDETR.new("r18", nc=3, device="cpu", seed=0)
    with torch.no_grad():
        x = torch.rand(2, 3, 96, 96)
        assert m.model(x)["pred_logits"].shape == (2, 189, 3)
        b, s, c = m.infer(x)                        # K = min(NUM_TOP, 189 * 3)
        assert b.shape == (2, 300, 4) and s.shape == (2, 300) and int(c.max()) < 3
        b, s, c = m.infer(torch.rand(1, 3, 64, 64))   # 84 queries * 3 classes < 300
        assert b.shape == (1, 252, 4)


def test_fuse_keeps_network_outputs():
    net, x = _fixture_net(RTDETR, "rtdetr-r18")
    with torch.no_grad():
        ref = net(x)
        net.fuse()
        out = net(x)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    for k in ("pred_logits", "pred_boxes"):
        assert ((out[k] - ref[k]).norm() / ref[k].norm()).item() < 1e-5


def test_training_forward_returns_auxiliary_outputs():
    net = RTDETRv2.build_network("r18", 5).train()
    out = net(torch.rand(2, 3, 32, 32))             # 16 + 4 + 1 tokens -> 21 queries
    assert out["pred_logits"].shape == (2, 21, 5) and len(out["aux_outputs"]) == 2
    assert out["enc_outputs"]["pred_boxes"].shape == (2, 21, 4)
    out["pred_boxes"].sum().backward()
    assert net.decoder.dec_bbox_head[2].layers[0].weight.grad is not None


def test_predict_end_to_end_without_nms():
    """A DETR through the shared predictor: stretch resize, top-k selection, no NMS, boxes in
    original-image pixels, sorted by confidence, at most max_det per image."""
    import numpy as np

    from libreyolo import SAMPLE_IMAGE
    m = RTDETR.new("r18", nc=3, device="cpu", seed=0)
    assert m.NMS is False and m.resize == "stretch"
    img = np.random.default_rng(0).integers(0, 256, (90, 150, 3), dtype=np.uint8)
    r = m(img, imgsz=128, conf=0.0, max_det=7)
    assert len(r) == 7
    conf = r.boxes.conf
    assert (conf[:-1] >= conf[1:]).all()
    xyxy = r.boxes.xyxy
    assert (xyxy[:, 0] >= 0).all() and (xyxy[:, 2] <= 150).all() and (xyxy[:, 3] <= 90).all()
    s = m(SAMPLE_IMAGE, imgsz=128, conf=0.99)
    assert len(s) <= 300
