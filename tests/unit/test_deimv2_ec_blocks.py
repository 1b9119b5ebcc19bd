"""DEIMv2 and EC (EdgeCrafter ECDet): names, sizes, anchors, fusing and the inference stage."""
import json

import pytest
import torch
from conftest import FIXTURES_DIR
from fill import fill_state_dict

from libreyolo import LibreYOLO
from libreyolo.models.deimv2.model import Deimv2
from libreyolo.models.deimv2.nn import DEIMV2_CONFIGS, DINO_SIZES, DinoSpec, DINOv3STABackbone
from libreyolo.models.detr_common.model import IMAGENET, PIL_STRETCH
from libreyolo.models.detr_common.rtdetr_decoder import generate_anchors
from libreyolo.models.ec.model import EC
from libreyolo.models.registry import family_for_checkpoint, parse_spec


@pytest.mark.parametrize("text,cls,size", [
    ("LibreDEIMv2atto.pt", Deimv2, "atto"), ("LibreDEIMv2n.pt", Deimv2, "n"), ("deimv2-pico", Deimv2, "pico"),
    ("LibreDEIMv2s.pt", Deimv2, "s"), ("deimv2-x", Deimv2, "x"),
    ("LibreECs.pt", EC, "s"), ("LibreECx.pt", EC, "x"), ("ec-m", EC, "m"),
])
def test_file_names_select_the_family(text, cls, size):
    assert parse_spec(text) == (cls, size)


def test_file_names_of_neighbouring_families_are_not_taken():
    hit = parse_spec("LibreDEIMn.pt")
    assert hit is not None and hit[0].FAMILY == "deim"
    hit = parse_spec("LibreDEIMs.pt")
    assert hit is not None and hit[0].FAMILY == "deim" and parse_spec("LibreDEIMv2s.pt") == (Deimv2, "s")


#: the DEIMv2 paper's / README's parameter counts (millions, one decimal) of the ViT sizes
PAPER_PARAMS_M = {"s": 9.7, "m": 18.1, "l": 32.2, "x": 50.3}


@pytest.mark.parametrize("size", DINO_SIZES)
def test_vit_sizes_build_with_the_upstream_layout_and_parameter_count(size):
    """Layout from the reference code (no fixture pins it) and the paper's count, which is taken
    after the reference deploy step: BatchNorms folded, RepVGG merged, and only the last
    decoder layer's score head and LQE kept."""
    with torch.device("meta"):
        net = Deimv2.build_network(size, 80)
    keys = net.state_dict().keys()
    vit = "backbone.dinov3._model." if size in ("s", "m") else "backbone.dinov3."
    assert {f"{vit}cls_token", f"{vit}patch_embed.proj.weight", f"{vit}rope_embed.periods",
            f"{vit}blocks.11.attn.qkv.weight"} <= keys
    assert {"backbone.sta.stem.0.weight", "backbone.sta.conv4.2.running_var", "backbone.convs.2.weight",
            "backbone.norms.0.weight"} <= keys
    dinov3 = {f"{vit}storage_tokens", f"{vit}mask_token", f"{vit}norm.weight", f"{vit}blocks.0.ls1.gamma",
              f"{vit}blocks.0.attn.qkv.bias_mask"}
    assert dinov3 <= keys if size in ("l", "x") else not (dinov3 & keys)
    assert (f"{vit}blocks.0.mlp.w3.weight" in keys) == (size == "x")
    assert not any(k.startswith("encoder.input_proj") for k in keys)   # levels already hidden_dim wide
    cfg = DEIMV2_CONFIGS[size]
    assert len(net.decoder.decoder.layers) == cfg.num_layers == (6 if size == "x" else 4)
    assert "decoder.decoder.layers.0.gateway.norm.scale" in keys
    net.eval()
    with torch.device("meta"):
        net.fuse()
    dec = net.decoder
    dropped = sum(p.numel() for m in [*dec.dec_score_head[:-1], *dec.decoder.lqe_layers[:-1]] for p in m.parameters())
    deployed = sum(p.numel() for p in net.parameters()) - dropped
    assert round(deployed / 1e6, 1) == PAPER_PARAMS_M[size]


@pytest.mark.parametrize("size", DINO_SIZES)
def test_vit_sizes_are_sniffed_from_their_own_state_dict(size):
    """No metadata, an anonymous file: the keys pick DEIMv2 (not EC), the shapes pick the size."""
    with torch.device("meta"):
        sd = Deimv2.build_network(size, 80).state_dict()
    cls, hint, how = family_for_checkpoint({"model": sd}, "weights.pt")
    assert cls is Deimv2 and hint is None and how == "state-dict keys"
    assert not EC.owns_state_dict(sd)
    assert Deimv2.sniff_size(sd, 80) == size and Deimv2.nc_from_state_dict(sd) == 80


def test_vit_size_round_trips_and_normalises_with_imagenet_statistics():
    m = Deimv2.new("s", device="cpu", seed=0)
    assert m.preprocess == IMAGENET and m.imgsz == 640 and Deimv2.PREPROCESS.mean is None
    back = Deimv2.from_checkpoint(m.checkpoint(), device="cpu")
    assert back.size == "s" and back.preprocess == IMAGENET
    assert Deimv2.new("atto", device="cpu").preprocess == PIL_STRETCH
    assert all(torch.equal(a, b) for a, b in zip(m.model.state_dict().values(), back.model.state_dict().values()))


def test_dinov3_style_adapter_backbone_small():
    """The DINOv3 options of the shared ViT on a narrow stand-in (width 32, SwiGLU, 4 register
    tokens): pyramid shapes, key bias masked out, RoPE rescaling only in training, fusing exact."""
    torch.manual_seed(0)
    bb = DINOv3STABackbone(DinoSpec(32, 2, (5, 8, 11), 4, 24, dinov3=True, ffn_ratio=6.0, ffn="swiglu"))
    qkv = bb.vit.blocks[0].attn.qkv
    assert qkv.bias_mask.tolist() == [1.0] * 32 + [0.0] * 32 + [1.0] * 32
    assert bb.vit.blocks[0].mlp.w1.out_features == 128   # int(192 * 2 / 3), already a multiple of 8
    for blk in bb.vit.blocks:   # stand-in for trained layer scales, so the blocks matter
        blk.ls1.gamma.data.fill_(0.5)
        blk.ls2.gamma.data.fill_(0.5)
    x = torch.randn(2, 3, 64, 64)
    bb.eval()
    with torch.no_grad():
        out = bb(x)
        assert [tuple(f.shape) for f in out] == [(2, 24, 8, 8), (2, 24, 4, 4), (2, 24, 2, 2)]
        assert all(torch.equal(a, b) for a, b in zip(out, bb(x)))
        bb.vit.rope_embed.train()
        torch.manual_seed(1)
        jittered = bb(x)
        bb.vit.rope_embed.eval()
        assert not torch.allclose(jittered[1], out[1])
        bb.fuse()
        fused = bb(x)
    for a, b in zip(out, fused):
        assert ((a - b).norm() / a.norm()).item() <= 1e-5


@pytest.mark.parametrize("cls", [Deimv2, EC])
def test_every_size_builds_and_is_sniffed_back(cls):
    for size in cls.SIZES:
        with torch.device("meta"):
            sd = cls.build_network(size, 80).state_dict()
        assert cls.owns_state_dict(sd) and cls.sniff_size(sd, 80) == size
        assert cls.nc_from_state_dict(sd) == 80


def test_precomputed_anchors_equal_generated_ones():
    """The anchors/valid_mask buffers (used only at the native size) are the generated ones."""
    net = Deimv2.build_network("atto", 80)
    s = DEIMV2_CONFIGS["atto"].input_size
    anchors, valid = generate_anchors([(s // 16, s // 16), (s // 32, s // 32)])
    assert torch.equal(net.decoder.anchors, anchors) and torch.equal(net.decoder.valid_mask, valid)


@pytest.mark.parametrize("cls,size,imgsz,queries", [(Deimv2, "atto", 160, 100), (Deimv2, "s", 128, 300),
                                                     (EC, "s", 128, 300)])
def test_fixed_shape_inference(cls, size, imgsz, queries):
    m = cls.new(size, device="cpu", seed=0)
    x = torch.rand(2, 3, imgsz, imgsz)
    with torch.no_grad():
        out = m.model(x)
        assert out["pred_logits"].shape == (2, queries, 80) and out["pred_boxes"].shape == (2, queries, 4)
        boxes, scores, cls_ = m.infer(x)
    assert boxes.shape == (2, m.NUM_TOP, 4) and scores.shape == cls_.shape == (2, m.NUM_TOP)
    assert (scores[:, :-1] >= scores[:, 1:]).all()


@pytest.mark.parametrize("cls,size,name", [(Deimv2, "atto", "deimv2-atto"), (EC, "s", "ec-s")])
def test_fused_network_still_reproduces_the_fixture(cls, size, name):
    """BatchNorm folding and RepVGG merging keep the fixture outputs (relative L2 <= 1e-4)."""
    fx = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    pt = torch.load(FIXTURES_DIR / f"{name}.pt", weights_only=True)
    net = cls.build_network(size, 80)
    net.load_state_dict(fill_state_dict(fx["layout"], constants=pt["constants"], tied=fx["tied"]))
    net.eval().fuse()
    with torch.no_grad():
        out = net(pt["input"])
    for k, ref in pt["outputs"].items():
        assert ((out[k].double() - ref.double()).norm() / ref.double().norm()).item() <= 1e-4, k


def test_ec_normalises_with_imagenet_statistics_outside_the_network():
    m = EC.new("s", device="cpu", seed=0)
    assert m.preprocess == IMAGENET and m.preprocess.mean == (0.485, 0.456, 0.406)
    assert m.imgsz == 640 and Deimv2.new("atto", device="cpu").imgsz == 320


def test_untrained_by_name():
    m = LibreYOLO("deimv2atto", device="cpu")
    assert isinstance(m, Deimv2) and not m.trained
