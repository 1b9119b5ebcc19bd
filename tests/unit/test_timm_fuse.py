"""BatchNorm folding of the timm-built classifiers (``TimmClassifier.fuse``, ``fold_batchnorms``)."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.models.common.timm_fuse import fold_batchnorms

pytest.importorskip("timm")

#: (family, size, BatchNorms in the network): every one of them is a convolution's sole user
BN_FAMILIES = [("resnet", "18", 20), ("efficientnetv2", "b0", 59), ("mobilenetv4", "s", 46)]
NC = 10


def _randomize_bn(net: nn.Module, seed: int = 0) -> int:
    """Random running statistics and affine parameters in every BatchNorm (a non-trivial fold);
    scales below 1 keep the untrained network's activations moderate, so float32 rounding stays
    far inside the comparison's tolerance. Returns how many BatchNorms there are."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for bn in net.modules():
            if isinstance(bn, nn.BatchNorm2d):
                c = bn.num_features
                bn.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                bn.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                bn.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.3)
                bn.bias.copy_(torch.randn(c, generator=g) * 0.1)
                n += 1
    return n


def _model(family, size):
    m = LibreYOLO.new(family, size, nc=NC, imgsz=64, device="cpu", seed=0)
    m.model.eval()
    return m


def _n_bn(net):
    return sum(isinstance(m, nn.BatchNorm2d) for m in net.modules())


@pytest.mark.parametrize("family,size,n_bn", BN_FAMILIES, ids=lambda v: str(v))
def test_fold_every_batchnorm_and_keep_the_logits(family, size, n_bn):
    m = _model(family, size)
    assert _randomize_bn(m.model) == n_bn
    ref = copy.deepcopy(m.model)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    assert fold_batchnorms(copy.deepcopy(m.model)) == n_bn   # the count, on a copy
    assert m.fuse() is m and m.fused and not m.model.training
    assert _n_bn(m.model) == 0
    assert type(m.model) is type(ref)   # still the eager timm module, not a GraphModule
    with torch.no_grad():
        a, b = ref(x), m.infer(x)
    assert torch.allclose(b, a, rtol=1e-4, atol=1e-5), (b - a).abs().max()
    assert m.fuse() is m and _n_bn(m.model) == 0   # a second call is a no-op


def test_batchnormact_keeps_its_activation():
    m = _model("efficientnetv2", "b0")
    bn = m.model.bn1
    act = bn.act
    m.fuse()
    assert isinstance(m.model.bn1, nn.Sequential) and m.model.bn1[1] is act


def test_layernorm_network_folds_nothing():
    m = _model("convnext", "t")
    ref = copy.deepcopy(m.model)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    assert fold_batchnorms(copy.deepcopy(m.model)) == 0
    m.fuse()
    assert m.fused
    with torch.no_grad():
        assert torch.equal(m.infer(x), ref(x))


@pytest.mark.parametrize("family,size,n_bn", BN_FAMILIES, ids=lambda v: str(v))
def test_fused_predict_has_the_same_top1(family, size, n_bn):
    m = _model(family, size)
    _randomize_bn(m.model)
    with torch.no_grad():
        m.model.state_dict()[m.NC_KEY].mul_(40.0)   # spread the untrained head's logits: no near-ties
    img = np.random.default_rng(0).integers(0, 256, (80, 96, 3), dtype=np.uint8)
    before = m.predict(img)
    m.fuse()
    after = m.predict(img)
    assert after.probs.top1 == before.probs.top1
    assert torch.allclose(after.probs.data, before.probs.data, atol=1e-5)


def test_saving_a_fused_classifier_is_refused(tmp_path):
    m = _model("resnet", "18").fuse()
    with pytest.raises(ValueError, match="fused model cannot be saved"):
        m.save(tmp_path / "fused.pt")


class _TwoBranches(nn.Module):
    """conv1 -> bn1 (foldable); conv2 -> bn2 with conv2's output also added (not foldable)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.bn1(self.conv1(x))
        z = self.conv2(y)
        return self.bn2(z) + z


def test_a_conv_output_with_another_user_is_not_folded():
    net = _TwoBranches().eval()
    _randomize_bn(net)
    ref = copy.deepcopy(net)
    assert fold_batchnorms(net) == 1
    assert isinstance(net.bn1, nn.Identity) and isinstance(net.bn2, nn.BatchNorm2d)
    assert torch.equal(net.conv2.weight, ref.conv2.weight) and net.conv2.bias is None
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(x), ref(x), rtol=1e-4, atol=1e-5)


class _Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

    def forward(self, x):
        if x.sum() > 0:   # data-dependent control flow: not FX-traceable
            x = -x
        return self.bn(self.conv(x))


def test_an_untraceable_network_folds_nothing():
    net = _Untraceable().eval()
    assert fold_batchnorms(net) == 0
    assert isinstance(net.bn, nn.BatchNorm2d)


def test_a_batchnorm_without_running_stats_is_not_folded():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)).eval()
    assert fold_batchnorms(net) == 0
