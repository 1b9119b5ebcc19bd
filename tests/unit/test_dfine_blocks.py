"""The D-FINE line (D-FINE, DEIM, RT-DETRv4): sizes, shared layout, FDR maths, sniffing rules.

The fixture rows themselves live in ``rows.FIXTURES``; here the fixtures are also checked
order-free, as their ``tolerance_note`` prescribes (the decoder queries are a top-k over
nearly tied synthetic scores, so a correct network may return the same rows in another order).
"""
import json
import math

import pytest
import torch
from conftest import FIXTURES_DIR
from fill import fill_state_dict

from libreyolo import LibreYOLO
from libreyolo.models.deim.nn import DEIM_CONFIGS
from libreyolo.models.detr_common.dfine_decoder import distance_to_box, integral, weighting_function
from libreyolo.models.detr_common.hgnetv2 import FrozenBatchNorm2d
from libreyolo.models.detr_common.rtdetr_decoder import generate_anchors
from libreyolo.models.dfine.nn import DFINE_CONFIGS, DFineNet
from libreyolo.models.registry import family_for_checkpoint, get_family, parse_spec
from libreyolo.weights import save_checkpoint

LINE = ("dfine", "deim", "rtdetrv4")
#: parameters of each size (the published D-FINE models: 4M, 10M, 19M, 31M, 62M)
PARAMS = {"n": 3_782_693, "s": 10_321_877, "m": 19_590_064, "l": 31_244_152, "x": 62_621_560}


def load_fixture(name):
    fx = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    pt = torch.load(FIXTURES_DIR / f"{name}.pt", weights_only=True)
    return fx, pt, fill_state_dict(fx["layout"], constants=pt["constants"], tied=fx["tied"])


def matched_errors(out: dict, ref: dict) -> dict:
    """Per-output relative L2 after matching each reference row (logits ++ box) to its nearest row."""
    rows = lambda d, i: torch.cat([d["pred_logits"][i], d["pred_boxes"][i]], -1).double()  # noqa: E731
    errs = {"pred_logits": 0.0, "pred_boxes": 0.0}
    for i in range(ref["pred_logits"].shape[0]):
        idx = torch.cdist(rows(ref, i), rows(out, i)).argmin(1)
        for k in errs:
            r = ref[k][i].double()
            errs[k] = max(errs[k], ((out[k][i][idx].double() - r).norm() / r.norm()).item())
    return errs


@pytest.mark.parametrize("family,size,name", [("dfine", "n", "dfine-n"), ("deim", "n", "deim-n"),
                                              ("rtdetrv4", "s", "rtdetrv4-s")])
def test_fixture_reproduced_order_free(family, size, name):
    fx, pt, sd = load_fixture(name)
    net = get_family(family).build_network(size, 80)
    net.load_state_dict(sd, strict=True)
    with torch.no_grad():
        out = net.eval()(pt["input"])
    for k, err in matched_errors(out, pt["outputs"]).items():
        assert err <= 1e-4, (k, err)


def test_dfine_and_deim_fixtures_tell_the_decoder_activations_apart():
    """Same layout, same weights: only the activations (ReLU vs SiLU) separate the two."""
    _, pt, sd = load_fixture("deim-n")
    net = DFineNet(DFINE_CONFIGS["n"])
    net.load_state_dict(sd)
    with torch.no_grad():
        out = net.eval()(pt["input"])
    assert min(matched_errors(out, pt["outputs"]).values()) > 1e-2


@pytest.mark.parametrize("size", PARAMS)
def test_every_size_builds_and_the_three_families_share_its_layout(size):
    with torch.device("meta"):
        nets = {f: get_family(f).build_network(size, 80) for f in LINE if size in get_family(f).SIZES}
    layouts = {f: [(k, tuple(v.shape)) for k, v in n.state_dict().items()] for f, n in nets.items()}
    assert all(layout == layouts["dfine"] for layout in layouts.values())
    assert sum(p.numel() for p in nets["dfine"].parameters()) == PARAMS[size]
    # L and X keep frozen backbone norms (no num_batches_tracked), as in their checkpoints
    frozen = not any(k.startswith("backbone.") and k.endswith("num_batches_tracked") for k, _ in layouts["dfine"])
    assert frozen == (size in ("l", "x"))
    assert get_family("rtdetrv4").SIZES == ("s", "m", "l", "x")


@pytest.mark.parametrize("family,size", [("dfine", "s"), ("deim", "m")])
def test_other_sizes_run_with_fixed_output_shapes(family, size):
    model = get_family(family).new(size, nc=7, device="cpu", seed=0)
    x = torch.rand(2, 3, 160, 160, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        raw = model.model(x)
        boxes, scores, cls = model.infer(x)
    assert raw["pred_logits"].shape == (2, 300, 7) and raw["pred_boxes"].shape == (2, 300, 4)
    assert boxes.shape == (2, 300, 4) and scores.shape == (2, 300) and cls.shape == (2, 300)
    assert torch.isfinite(boxes).all() and (scores >= 0).all() and (scores <= 1).all()


def test_frozen_norm_equals_batchnorm_in_eval():
    """L / X backbones: FrozenBatchNorm2d computes what an eval-mode BatchNorm2d does."""
    bn = torch.nn.BatchNorm2d(8).eval()
    for t in (bn.weight, bn.bias, bn.running_mean):
        t.data.normal_()
    bn.running_var.data.uniform_(0.5, 2.0)
    frozen = FrozenBatchNorm2d(8)
    frozen.load_state_dict({k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"})
    x = torch.randn(2, 8, 5, 5)
    assert torch.allclose(frozen(x), bn(x), atol=1e-5)


def test_small_inputs_keep_every_token_as_a_query():
    """Fewer tokens than queries (n at 128 px: 8x8 + 4x4): all become queries, nothing fails."""
    model = get_family("dfine").new("n", device="cpu", seed=0)
    with torch.no_grad():
        raw = model.model(torch.rand(1, 3, 128, 128))
        boxes, scores, _ = model.infer(torch.rand(1, 3, 128, 128))
    assert raw["pred_logits"].shape == (1, 80, 80) and boxes.shape == (1, 300, 4)


def test_batch_rows_equal_single_image_rows():
    _, pt, sd = load_fixture("dfine-n")
    net = DFineNet(DFINE_CONFIGS["n"])
    net.load_state_dict(sd)
    net.eval()
    x = torch.cat([pt["input"], pt["input"].flip(-1)])
    with torch.no_grad():
        both = net(x)
        for i in range(2):
            one = net(x[i:i + 1])
            part = {k: v[i:i + 1] for k, v in both.items()}
            assert max(matched_errors(part, one).values()) <= 1e-5


def test_fuse_matches_unfused():
    _, pt, sd = load_fixture("deim-n")
    net = DFineNet(DEIM_CONFIGS["n"])
    net.load_state_dict(sd)
    net.eval()
    with torch.no_grad():
        ref = net(pt["input"])
        net.fuse()
        out = net(pt["input"])
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    assert max(matched_errors(out, ref).values()) <= 1e-4


def test_weighting_function_matches_its_definition():
    up, reg_scale, reg_max = torch.tensor([0.5]), torch.tensor([4.0]), 32
    w = weighting_function(reg_max, up, reg_scale)
    bound = 0.5 * 4.0
    step = (bound + 1) ** (2 / (reg_max - 2))
    expected = ([-2 * bound] + [1 - step ** i for i in range(reg_max // 2 - 1, 0, -1)] + [0.0]
                + [step ** i - 1 for i in range(1, reg_max // 2)] + [2 * bound])
    assert w.shape == (reg_max + 1,)
    assert torch.allclose(w.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert (w.diff() > 0).all() and torch.allclose(w, -w.flip(0)) and w[reg_max // 2] == 0


def test_integral_and_box_decoding():
    w = weighting_function(32, torch.tensor([0.5]), torch.tensor([4.0]))
    flat = torch.zeros(2, 5, 4 * 33)                        # uniform bins: expectation 0 by symmetry
    assert integral(flat, w, 32).abs().max() < 1e-6
    ref = torch.tensor([[0.5, 0.4, 0.2, 0.1]])
    assert torch.allclose(distance_to_box(ref, torch.zeros(1, 4), torch.tensor([4.0])), ref)
    # moving every edge out by reg_scale / 2 doubles the box around the same centre
    grown = distance_to_box(ref, torch.full((1, 4), 2.0), torch.tensor([4.0]))
    assert torch.allclose(grown, torch.tensor([[0.5, 0.4, 0.4, 0.2]]))


def test_stored_anchors_are_the_generated_ones_for_the_native_size():
    _, pt, _ = load_fixture("dfine-n")
    anchors, valid = generate_anchors([(40, 40), (20, 20)], eps=1e-2)       # 640 px, strides 16 / 32
    assert torch.equal(valid, pt["constants"]["decoder.valid_mask"])
    assert torch.allclose(anchors, pt["constants"]["decoder.anchors"])


def test_file_names_select_the_family():
    assert parse_spec("LibreDFINEn.pt") == (get_family("dfine"), "n")
    assert parse_spec("LibreDEIMx.pt") == (get_family("deim"), "x")
    assert parse_spec("LibreRTDETRv4s.pt") == (get_family("rtdetrv4"), "s")
    assert parse_spec("rtdetrv4-m") == (get_family("rtdetrv4"), "m")
    assert parse_spec("dfine_l") == (get_family("dfine"), "l")
    assert parse_spec("LibreRTDETRv4n.pt") is None                           # no n size in RT-DETRv4
    hit = parse_spec("LibreDEIMv2atto.pt")
    assert hit is None or hit[0] is not get_family("deim")


def test_bare_state_dicts_of_the_shared_layout_are_read_as_dfine(tmp_path):
    """DEIM / RT-DETRv4 checkpoints carry D-FINE's exact keys: metadata or file name decides,
    a bare state dict is D-FINE (the one deterministic answer, documented in the classes)."""
    fx, pt, sd = load_fixture("deim-n")
    assert family_for_checkpoint({"model": sd}, "anonymous.pt")[:2] == (get_family("dfine"), None)
    assert family_for_checkpoint({"model": sd}, "LibreDEIMn.pt")[:2] == (get_family("deim"), "n")
    assert family_for_checkpoint({"model": sd, "model_family": "deim"}, None)[0] is get_family("deim")
    path = save_checkpoint({"model": sd}, tmp_path / "LibreDEIMn.pt")
    model = LibreYOLO(str(path), device="cpu")
    assert (model.FAMILY, model.size) == ("deim", "n")
    with torch.no_grad():
        out = model.model(pt["input"])
    assert max(matched_errors(out, pt["outputs"]).values()) <= 1e-4


@pytest.mark.parametrize("other", ["rtdetr-r18", "rtdetrv2-r18", "deimv2-atto", "ec-s"])
def test_dfine_signature_keys_do_not_claim_other_detr_layouts(other):
    path = FIXTURES_DIR / f"{other}.json"
    if not path.exists():
        pytest.skip(f"{other} fixture not copied")
    keys = {name: None for name, _, _ in json.loads(path.read_text())["layout"]}
    assert not any(get_family(f).owns_state_dict(keys) for f in LINE)
    keys = {name: None for name, _, _ in json.loads((FIXTURES_DIR / "rtdetrv4-s.json").read_text())["layout"]}
    assert get_family("dfine").owns_state_dict(keys)


def test_sizes_are_sniffed_from_shapes():
    _, _, sd = load_fixture("rtdetrv4-s")
    for family in LINE:
        assert get_family(family).sniff_size(sd, 80) == "s"
    assert math.isclose(DFINE_CONFIGS["x"].reg_scale, 8.0)
