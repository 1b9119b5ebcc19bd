"""SegFormer network: fixture reproduction, per-size parameter counts, shapes and training."""
import json

import pytest
import torch
from conftest import FIXTURES_DIR
from fill import fill_state_dict

from libreyolo.models.segformer.nn import CONFIGS, SegformerNet

# Computed from this implementation with nc=150; they agree with the published SegFormer sizes
# (3.7M, 13.7M, 27.5M, 47.3M, 64.1M, 84.7M) and b0 equals the fixture's num_parameters.
PARAMS_150 = {
    "b0": 3_752_694,
    "b1": 13_715_798,
    "b2": 27_461_974,
    "b3": 47_337_814,
    "b4": 64_108_374,
    "b5": 84_708_694,
}


def test_b0_reproduces_fixture():
    fx = json.loads((FIXTURES_DIR / "segformer-b0.json").read_text())
    pt = torch.load(FIXTURES_DIR / "segformer-b0.pt", weights_only=True)
    sd = fill_state_dict(fx["layout"], constants=pt["constants"], tied=fx["tied"])
    net = SegformerNet("b0", fx["checkpoint_metadata"]["nc"])
    assert list(net.state_dict()) == [n for n, _, _ in fx["layout"]], "checkpoint key order differs"
    assert [list(v.shape) for v in net.state_dict().values()] == [s for _, s, _ in fx["layout"]]
    assert sum(p.numel() for p in net.parameters()) == fx["num_parameters"]
    net.load_state_dict(sd, strict=True)
    net.eval()
    with torch.no_grad():
        out = net(pt["input"])
    ref = pt["outputs"]["output"]
    assert out.shape == ref.shape
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err <= 1e-4, err


@pytest.mark.parametrize("size", sorted(CONFIGS))
def test_every_size_builds_with_expected_parameter_count(size):
    with torch.device("meta"):
        net = SegformerNet(size, 150)
    assert sum(p.numel() for p in net.parameters()) == PARAMS_150[size]
    assert "mean" not in net.state_dict() and "std" not in net.state_dict()


def test_non_square_input_gives_logits_at_input_size():
    torch.manual_seed(0)
    net = SegformerNet("b0", 7).eval()
    with torch.no_grad():
        out = net(torch.rand(2, 3, 64, 96))
        quarter = net.forward_features(torch.rand(2, 3, 64, 96))
    assert out.shape == (2, 7, 64, 96)
    assert quarter.shape == (2, 7, 16, 24)
    assert torch.isfinite(out).all()


def test_training_backward_reaches_every_parameter():
    torch.manual_seed(0)
    net = SegformerNet("b0", 5).train()
    x = torch.rand(2, 3, 32, 32)
    target = torch.randint(0, 5, (2, 32, 32))
    loss = torch.nn.functional.cross_entropy(net(x), target)
    loss.backward()
    assert torch.isfinite(loss)
    missing = [n for n, p in net.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, missing


def test_unknown_size_is_rejected_by_name():
    with pytest.raises(ValueError, match="b9"):
        SegformerNet("b9", 150)
