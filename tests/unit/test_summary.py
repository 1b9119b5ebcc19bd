"""libreyolo.models.summary: layers, parameters, gradients and GFLOPs of a network."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from libreyolo import LibreYOLO
from libreyolo.models import summary as S


def _tiny_conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))


# 2 flops per multiply-add, bias not counted: out pixels x out channels x (in channels x kernel area)
TINY_FLOPS_16 = 2 * (16 * 16 * 8 * 3 * 3 * 3) + 2 * (16 * 16 * 4 * 8)


class _ReadsAValue(nn.Module):
    """Calls .item(), which the meta device cannot answer: the count falls back to a real forward."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _tiny_conv_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return y * 2 if y.abs().sum().item() >= 0 else y


class _Attends(nn.Module):
    """Patchify, then self-attention over the tokens (need_weights=False: SDPA inside)."""

    def __init__(self, meta_proof: bool) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 8, stride=8)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.meta_proof = meta_proof

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        if not self.meta_proof:
            t.sum().item()  # forces the real-device path
        return self.attn(t, t, t, need_weights=False)[0]


def test_hand_computed_counts() -> None:
    net = _tiny_conv_net()
    d = S.model_summary(net, 16, "detect", "tiny", "s", cuda_graph=False)
    assert d["layers"] == 4
    assert d["parameters"] == (8 * 27 + 8) + (8 + 8) + (4 * 8 + 4)
    assert d["gradients"] == d["parameters"]
    assert d["flops"] == TINY_FLOPS_16 and d["gflops"] == TINY_FLOPS_16 / 1e9
    assert d["flops_counted_on"] == "meta"
    assert (d["family"], d["size"], d["task"], d["imgsz"], d["cuda_graph"]) == ("tiny", "s", "detect", 16, False)


def test_frozen_parameters_are_not_gradients() -> None:
    net = _tiny_conv_net()
    for p in net[0].parameters():
        p.requires_grad_(False)
    d = S.model_summary(net, 16, "detect", "tiny", "s", cuda_graph=False)
    assert d["gradients"] == d["parameters"] - (8 * 27 + 8)


def test_meta_fallback_counts_the_same() -> None:
    d = S.model_summary(_ReadsAValue(), 16, "detect", "tiny", "s", cuda_graph=False)
    assert d["flops_counted_on"] == "cpu"
    assert d["flops"] == TINY_FLOPS_16


def test_attention_is_counted_on_the_real_device_too() -> None:
    """CPU's fused attention kernels have no flop formula; the fallback must not count them as 0."""
    torch.manual_seed(0)
    meta_path = _Attends(meta_proof=True).eval()
    real_path = copy.deepcopy(meta_path)
    real_path.meta_proof = False
    on_meta, where_meta = S.count_flops(meta_path, 64)
    on_cpu, where_cpu = S.count_flops(real_path, 64)
    assert (where_meta, where_cpu) == ("meta", "cpu")
    tokens, dim = (64 // 8) ** 2, 32
    attention = 2 * 2 * tokens * tokens * dim  # q @ k^T and weights @ v
    assert on_cpu == on_meta and on_meta > attention
    assert torch.backends.mha.get_fastpath_enabled()  # switched back


@pytest.fixture(scope="module")
def yolox_n():
    return LibreYOLO.new("yolox", "n", device="cpu", seed=0)


def test_small_detector(yolox_n) -> None:
    m = yolox_n
    net = m.model
    net.train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    d = S.model_summary(net, 64, m.TASK, m.FAMILY, m.size, m.SUPPORTS_CUDA_GRAPH)
    assert net.training and all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.device.type == "cpu" for p in net.parameters())

    assert d["parameters"] == sum(p.numel() for p in net.parameters()) == 912_159
    assert d["layers"] == sum(1 for mod in net.modules() if not list(mod.children()))
    assert d["task"] == "detect" and d["cuda_graph"] is True
    # Convolution flops scale with the pixel count: 4x the pixels, 4x the flops (strides divide 64 and 128).
    flops_64 = d["flops"]
    assert S.count_flops(net, 128)[0] == 4 * flops_64
    # The meta count equals a real forward's.
    with S._composite_attention():
        assert S._counted_forward(net, 64, torch.device("cpu")) == flops_64
    assert net.training

    line = S.format_summary(d)
    assert line.startswith("yolox-n summary: ")
    assert f"{d['layers']:,} layers, 912,159 parameters, 912,159 gradients" in line
    assert f"{d['gflops']:.1f} GFLOPs at 64x64, task detect, CUDA graphs: supported" in line


def test_bad_imgsz() -> None:
    with pytest.raises(ValueError, match="imgsz"):
        S.model_summary(_tiny_conv_net(), 0, "detect", "tiny", "s", cuda_graph=False)


def test_model_info_prints_one_line_and_returns_the_summary(capsys) -> None:
    from libreyolo import LibreYOLO
    m = LibreYOLO.new("yolox", "n", device="cpu", seed=0)
    d = m.info(imgsz=64)
    out = capsys.readouterr().out
    assert d["parameters"] == sum(p.numel() for p in m.model.parameters()) and d["task"] == "detect"
    assert out.count("\n") == 1 and "yolox" in out
