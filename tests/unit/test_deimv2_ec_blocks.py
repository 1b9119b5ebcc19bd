"""DEIMv2 and EC (EdgeCrafter ECDet): names, sizes, anchors, fusing and the inference stage."""
import json

import pytest
import torch
from fill import fill_state_dict

from conftest import FIXTURES_DIR

from libreyolo import LibreYOLO
from libreyolo.models.deimv2.model import Deimv2
from libreyolo.models.deimv2.nn import DEIMV2_CONFIGS
from libreyolo.models.detr_common.rtdetr_decoder import generate_anchors
from libreyolo.models.ec.model import EC
from libreyolo.models.registry import parse_spec


@pytest.mark.parametrize("text,cls,size", [
    ("LibreDEIMv2atto.pt", Deimv2, "atto"), ("LibreDEIMv2n.pt", Deimv2, "n"), ("deimv2-pico", Deimv2, "pico"),
    ("LibreECs.pt", EC, "s"), ("LibreECx.pt", EC, "x"), ("ec-m", EC, "m"),
])
def test_file_names_select_the_family(text, cls, size):
    assert parse_spec(text) == (cls, size)


def test_file_names_of_neighbouring_families_are_not_taken():
    hit = parse_spec("LibreDEIMn.pt")
    assert hit is not None and hit[0].FAMILY == "deim"
    assert parse_spec("LibreDEIMv2s.pt") is None   # DINOv3 size: not implemented


@pytest.mark.parametrize("size", ["s", "m", "l", "x"])
def test_dinov3_sizes_are_refused_with_the_reason(size):
    with pytest.raises(ValueError, match="DINOv3"):
        Deimv2.new(size, device="cpu")
    with pytest.raises(ValueError, match="DINOv3"):
        Deimv2.from_checkpoint({"model": {}, "size": size, "nc": 80})


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


@pytest.mark.parametrize("cls,size,imgsz,queries", [(Deimv2, "atto", 160, 100), (EC, "s", 128, 300)])
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
    assert m.INPUT_NORM == "imagenet" and Deimv2.INPUT_NORM == "none"
    assert m.imgsz == 640 and Deimv2.new("atto", device="cpu").imgsz == 320


def test_untrained_by_name():
    m = LibreYOLO("deimv2atto", device="cpu")
    assert isinstance(m, Deimv2) and not m.trained
