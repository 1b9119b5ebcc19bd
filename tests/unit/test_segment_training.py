"""RTMDet-Ins training quality: what is validated after a short run is what was trained.

RTMDet's head ties its tower convolutions across the three levels (one tensor under three
state-dict names). The moving average of the weights once blended such a tensor once per name,
which made the averaged convolutions about three times the trained ones early in a run: the
validated (and saved) model predicted nothing while the training losses fell.
"""
import torch

from libreyolo.engine.optim import ModelEMA
from libreyolo.models.rtmdet.nn import RtmdetInsNet


def test_ema_of_an_unchanged_network_with_tied_convs_is_that_network():
    torch.manual_seed(0)
    net = RtmdetInsNet("t", nc=5)
    tied = net.head.cls_convs[1][0].conv.weight
    assert tied is net.head.cls_convs[0][0].conv.weight   # the layout this test is about
    ema = ModelEMA(net, tau=2000.0)
    for _ in range(10):
        ema.update()
    got, want = ema.ema.state_dict(), net.state_dict()
    bad = [k for k in want if want[k].is_floating_point() and not torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-7)]
    assert bad == []
