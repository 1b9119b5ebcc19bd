"""YOLOv2 / YOLOv3 / YOLOv4 (the shared Darknet module): layouts of every size, the Darknet layers,
decode, the classic losses, predict and checkpoints.

The fixture reproduction of the t sizes is a row of ``rows.FIXTURES`` (tests/unit/test_fixtures.py)
and the two-epoch training smoke test rows of ``rows.TRAIN_MODELS`` (tests/unit/test_trainer.py).
No fixture pins the b / spp sizes: they are checked here by layout, parameter count and output
shapes on the meta device (no full-size forward in the fast tests).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from loss_cases import (
    ROWS,
    assert_autocast_computes_in_float32,
    assert_fixed_shapes_and_finite_backward,
    assert_graph_replay_matches_eager,
    assert_no_host_sync,
    cuda_batches,
    fit_one_batch,
    loss_without_objects,
    padded_targets,
)
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.models.darknet import cfgs
from libreyolo.models.darknet.loss import DarknetLoss
from libreyolo.models.darknet.nn import (
    DARKNET_BN_EPS,
    DarknetBatchNorm2d,
    DarknetConv,
    DarknetDetector,
    MaxPool,
    Reorg,
    head_tables,
    join_heads,
)
from libreyolo.models.registry import FAMILIES, get_family, parse_spec

FAMILIES_T = ("yolo2", "yolo3", "yolo4")

# Every size: its parameter count (the published one: Ultralytics' model summaries of the Darknet
# cfgs, 61,949,149 / 62,998,749 / 64,363,101; the fixtures' for t), its [convolutional] layers,
# its cfg layers and the byte size of the original Darknet .weights file of that cfg (header,
# then every conv's biases, BatchNorm scales, running means and variances, weights as float32:
# a header of 16 bytes for yolov2.weights, 20 for the later files).
SIZES = {
    ("yolo2", "t"): (11_232_057, 9, 16, 44_948_600 - 20, (32,)),
    ("yolo2", "b"): (50_962_889, 23, 32, 203_934_260 - 16, (32,)),
    ("yolo3", "t"): (8_852_366, 13, 24, 35_434_956 - 20, (32, 16)),
    ("yolo3", "b"): (61_949_149, 75, 107, 248_007_048 - 20, (32, 16, 8)),
    ("yolo3", "spp"): (62_998_749, 76, 114, 252_209_544 - 20, (32, 16, 8)),
    ("yolo4", "t"): (6_056_606, 21, 38, 24_251_276 - 20, (32, 16)),
    ("yolo4", "b"): (64_363_101, 110, 162, 257_717_640 - 20, (8, 16, 32)),
}


def _meta_net(family, size, nc=80):
    with torch.device("meta"):
        return get_family(family).build_network(size, nc)


@pytest.mark.parametrize("family,size", list(SIZES), ids=[f"{f}-{s}" for f, s in SIZES])
def test_every_size_has_the_original_cfgs_layout(family, size):
    params, convs, layers, weight_bytes, strides = SIZES[(family, size)]
    net = _meta_net(family, size)
    assert sum(p.numel() for p in net.parameters()) == params
    assert sum(isinstance(m, DarknetConv) for m in net.modules()) == convs
    assert len(net.body.layers) == layers
    assert 4 * sum(t.numel() for t in net.state_dict().values()) == weight_bytes
    assert tuple(h.stride for h in net.heads) == strides
    assert all(k.startswith(f"{family}.layers.") for k in net.state_dict())
    assert not any("num_batches_tracked" in k for k in net.state_dict())
    # the output shapes, on the meta device (no computation): every route and shortcut fits
    maps = net(torch.empty(2, 3, 416, 416, device="meta"))
    na = 5 if family == "yolo2" else 3
    assert [tuple(m.shape) for m in maps] == [(2, na * 85, 416 // s, 416 // s) for s in strides]


def test_full_sizes_follow_the_cfgs_wiring():
    """The taps of the original cfgs: YOLOv3's routes read layers 61 and 36, YOLOv4's 85 and 54,
    YOLOv2's passthrough layer 16 into layer 28; YOLOv4's backbone is Mish, its neck leaky."""
    v3 = _meta_net("yolo3", "b").body
    assert v3._sources[86] == [85, 61] and v3._sources[98] == [97, 36]
    spp = _meta_net("yolo3", "spp").body
    assert spp._sources[83] == [82, 80, 78, 77]
    v4 = _meta_net("yolo4", "b").body
    assert v4._sources[119] == [85] and v4._sources[129] == [54] and v4._sources[153] == [152, 116]
    assert isinstance(v4.layers[104].act, torch.nn.Mish) and isinstance(v4.layers[105].act, torch.nn.LeakyReLU)
    v2 = _meta_net("yolo2", "b").body
    assert v2._sources[25] == [16] and v2._sources[28] == [27, 24]
    assert v2.layers[29].conv.in_channels == 64 * 4 + 1024
    assert [h.scale_x_y for h in _meta_net("yolo4", "b").heads] == [1.2, 1.1, 1.05]
    assert [h.anchors for h in _meta_net("yolo4", "t").heads] == [((81, 82), (135, 169), (344, 319)),
                                                                  ((23, 27), (37, 58), (81, 82))]


def test_names_sizes_and_state_dicts_are_told_apart():
    assert parse_spec("yolo3-spp") == (FAMILIES["yolo3"], "spp")
    assert parse_spec("LibreYOLO4b.pt") == (FAMILIES["yolo4"], "b")
    assert parse_spec("yolo2t") == (FAMILIES["yolo2"], "t")
    for family in FAMILIES_T:
        cls = get_family(family)
        for size in cls.SIZES:
            sd = _meta_net(family, size, nc=7).state_dict()
            owners = [f for f, c in FAMILIES.items() if c.owns_state_dict(sd)]
            assert owners == [family], (family, size, owners)
            assert cls.nc_from_state_dict(sd) == 7
            assert cls.sniff_size(sd, 7) == size


# ---------------------------------------------------------------------------------- layers
def test_batchnorm_is_darknets_in_eval_and_torchs_in_training():
    bn = DarknetBatchNorm2d(2)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([2.0, 1.0]))
        bn.bias.copy_(torch.tensor([0.5, -1.0]))
        bn.running_mean.copy_(torch.tensor([1.0, 0.0]))
        bn.running_var.copy_(torch.tensor([4e-6, 9.0]))
    x = torch.tensor([3.0, 6.0]).view(1, 2, 1, 1)
    want = [(3.0 - 1.0) / (math.sqrt(4e-6) + DARKNET_BN_EPS) * 2.0 + 0.5, 6.0 / (3.0 + DARKNET_BN_EPS) - 1.0]
    torch.testing.assert_close(bn.eval()(x).view(-1), torch.tensor(want))
    # torch's sqrt(var + eps) would give 1/sqrt(5e-6) instead of 1/(2e-3 + 1e-6) on channel 0
    assert abs(bn(x).view(-1)[0].item() - want[0]) < 1e-3 * want[0]
    y = torch.randn(4, 2, 3, 3)
    ref = torch.nn.BatchNorm2d(2, eps=DARKNET_BN_EPS, momentum=0.03)
    ref.load_state_dict(bn.state_dict(), strict=False)
    torch.testing.assert_close(bn.train()(y), ref.train()(y))
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    assert "num_batches_tracked" not in bn.state_dict()
    bn.load_state_dict({k: v.clone() for k, v in bn.state_dict().items()}, strict=True)   # no metadata


def test_fuse_keeps_the_outputs():
    torch.manual_seed(0)
    net = DarknetDetector("yolo3", cfgs.YOLOV3_TINY, 3).eval()
    for m in net.modules():
        if isinstance(m, DarknetBatchNorm2d):
            with torch.no_grad():
                m.running_var.uniform_(0.5, 1.5)
                m.running_mean.normal_(0, 0.1)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = net(x)
        after = net.fuse()(x)
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert not any(isinstance(m, DarknetBatchNorm2d) for m in net.modules())


def test_maxpool_pads_with_minus_infinity_as_darknet():
    x = -torch.arange(1.0, 10.0).view(1, 1, 3, 3)       # all negative: a zero pad would win
    same = MaxPool(2, 1)(x)
    assert same.shape == (1, 1, 3, 3)
    torch.testing.assert_close(same[0, 0], torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0], [-7.0, -8.0, -9.0]]))
    down = MaxPool(2, 2)(x)                              # odd side: (3 + 1 - 2) // 2 + 1 = 2
    torch.testing.assert_close(down[0, 0], torch.tensor([[-1.0, -3.0], [-7.0, -9.0]]))
    spp = MaxPool(5, 1)(x)
    assert spp.shape == x.shape and spp.max() == -1.0


def test_reorg_puts_each_subpixel_offset_in_its_own_channel_block():
    x = torch.arange(2 * 4 * 4, dtype=torch.float32).view(1, 2, 4, 4)
    y = Reorg(2)(x)
    assert y.shape == (1, 8, 2, 2)
    for dy in range(2):
        for dx in range(2):
            for c in range(2):
                torch.testing.assert_close(y[0, (dy * 2 + dx) * 2 + c], x[0, c, dy::2, dx::2])
    assert y[0, :, 0, 0].tolist() == [0, 16, 1, 17, 4, 20, 5, 21]
    with pytest.raises(ValueError, match="divide"):
        Reorg(2)(torch.zeros(1, 1, 3, 4))


# ---------------------------------------------------------------------------------- decode
def test_decode_by_hand():
    """[yolo] with scale_x_y: logits 0 put the centre mid-cell whatever the scale; a logit 2 puts it
    at (sigmoid(2) * 1.05 - 0.025); size = anchor * exp(tw). [region]: anchors in cells x stride,
    softmax classes."""
    net = DarknetDetector("yolo4", cfgs.YOLOV4_TINY, 2)
    maps = [torch.zeros(1, 3 * 7, 2, 2), torch.zeros(1, 3 * 7, 4, 4)]          # 64 px: strides 32, 16
    maps[0][0, 0, 1, 0] = 2.0                 # head 0, anchor 0, row 1, col 0: tx
    maps[0][0, 3, 1, 0] = math.log(2.0)       # th: twice the anchor's height
    maps[0][0, 5, 1, 0] = 3.0                 # class 0
    boxes, score, cls = net.decode(maps)
    assert boxes.shape == (1, 3 * 4 + 3 * 16, 4)
    i = 1 * 2 + 0                             # (anchor 0, row 1, col 0) of head 0
    s = torch.sigmoid(torch.tensor(2.0)).item()
    cx, cy = (s * 1.05 - 0.025) * 32, 1.5 * 32
    torch.testing.assert_close(boxes[0, i], torch.tensor([cx - 40.5, cy - 82.0, cx + 40.5, cy + 82.0]))
    torch.testing.assert_close(score[0, i], torch.tensor(0.5 * torch.sigmoid(torch.tensor(3.0)).item()))
    assert cls[0, i] == 0
    torch.testing.assert_close(boxes[0, 0], torch.tensor([16 - 40.5, 16 - 41.0, 16 + 40.5, 16 + 41.0]))

    v2 = DarknetDetector("yolo2", cfgs.YOLOV2_TINY, 2)
    m = torch.zeros(1, 5 * 7, 1, 1)
    m[0, 5] = math.log(3.0)                   # anchor 0, class 0: softmax 3/4
    boxes, score, cls = v2.decode([m])
    aw, ah = cfgs.ANCHORS_V2[0]
    torch.testing.assert_close(boxes[0, 0], torch.tensor([16 - aw * 16, 16 - ah * 16, 16 + aw * 16, 16 + ah * 16]))
    torch.testing.assert_close(score[0, 0], torch.tensor(0.5 * 0.75))


# ---------------------------------------------------------------------------------- losses
NC = 3
RC = [[[min(r[0], NC - 1)] + r[1:] for r in img] for img in ROWS]      # ROWS with classes < NC


def _crit(family, nc=NC, imgsz=64):
    return LibreYOLO.new(family, "t", nc=nc, imgsz=imgsz, device="cpu", seed=0).build_loss()


def _maps(family, b, gen, nc=NC, side=64, scale=1.0):
    net = DarknetDetector(family, {"yolo2": cfgs.YOLOV2_TINY, "yolo3": cfgs.YOLOV3_TINY,
                                   "yolo4": cfgs.YOLOV4_TINY}[family], nc)
    return [torch.randn(b, len(h.anchors) * (5 + nc), side // h.stride, side // h.stride, generator=gen) * scale
            for h in net.heads]


@pytest.mark.parametrize("family", FAMILIES_T)
def test_padding_rows_change_nothing_bit_for_bit(family):
    """Targets padded to 4, 16 or 64 rows (garbage or zeros in the padding) give the unpadded loss
    and items exactly; a batch with no target rows at all equals 16 rows of padding."""
    maps = _maps(family, 3, torch.Generator().manual_seed(0))
    crit = _crit(family)
    l0, i0 = crit(maps, *padded_targets(RC, 3, garbage=False))
    for m in (4, 16, 64):
        for garbage in (False, True):
            lm, im = crit(maps, *padded_targets(RC, m, garbage=garbage))
            assert torch.equal(lm, l0) and torch.equal(im, i0), (m, garbage)
    assert torch.isfinite(i0).all() and (i0 > 0).all()
    _, empty = loss_without_objects(lambda t, m: crit(maps, t, m), 3)
    assert empty[0] == 0 and empty[2] == 0 and empty[1] > 0


def _column_winner(crit, maps, rows):
    """The (B, N) winning gt rank (0: none) the loss assigns, recomputed through its own pieces."""
    targets, mask = padded_targets(rows, max(1, max(len(r) for r in rows)), garbage=False)
    gt = torch.cat((targets[..., 1:3] + targets[..., 3:5], targets[..., 3:5] - targets[..., 1:3]), -1)
    gt[..., :2] /= 2
    hw = [tuple(p.shape[-2:]) for p in maps]
    loc, live = crit._columns(gt, crit._anchor_choice(gt[..., 2:], mask), hw)
    return loc, live


def test_assignment_takes_the_best_shaped_anchor_at_the_centre_cell():
    """YOLOv3-tiny at 64 px (heads: stride 32 with anchors 3-5, stride 16 with anchors 0-2). A
    24x30 box centred at (20, 40): its best anchor is (23, 27) (anchor 1: IoU 0.86), on the stride-16
    head at cell (1, 2); one column is live."""
    crit = _crit("yolo3")
    maps = _maps("yolo3", 1, torch.Generator().manual_seed(0))
    loc, live = _column_winner(crit, maps, [[[0, 8, 25, 32, 55]]])
    assert live.sum() == 1
    k = int(live[0, 0].nonzero())
    start = 3 * 2 * 2                      # the stride-32 head's predictions come first
    assert k == 3 + 1 and int(loc[0, 0, k]) == start + (1 * 4 + 2) * 4 + 1


def test_yolov4_also_assigns_anchors_above_iou_thresh_and_v4_tiny_skips_unused_anchors():
    """YOLOv4 (iou_thresh 0.213): a 40x40 box takes its best anchor (40, 28) (shape IoU 0.70) and
    every other anchor above 0.213: (19, 36) 0.43, (36, 75) 0.50, (76, 55) 0.38, not (12, 16) 0.12.
    YOLOv4-tiny's heads use anchors 1-5: a 10x14 box (best anchor 0) is assigned nowhere."""
    net = _meta_net("yolo4", "b", NC)
    crit = DarknetLoss(net.heads, net.cfg, NC)
    gt = torch.tensor([[[20.0, 20.0, 40.0, 40.0]]])
    choice = crit._anchor_choice(gt[..., 2:], torch.ones(1, 1, dtype=torch.bool))[0, 0]
    aw = torch.tensor([a[0] for a in cfgs.ANCHORS_V4], dtype=torch.float32)
    ah = torch.tensor([a[1] for a in cfgs.ANCHORS_V4], dtype=torch.float32)
    inter = torch.minimum(aw, torch.tensor(40.0)) * torch.minimum(ah, torch.tensor(40.0))
    iou = inter / (1600 + aw * ah - inter)
    assert int(iou.argmax()) == 2 and choice[2]
    assert choice.tolist() == ((iou > 0.213) | (torch.arange(9) == 2)).tolist()
    assert choice.nonzero().flatten().tolist() == [1, 2, 3, 4]
    tiny = _crit("yolo4")
    maps = _maps("yolo4", 1, torch.Generator().manual_seed(0))
    _, live = _column_winner(tiny, maps, [[[0, 20, 20, 30, 34]]])
    assert live.sum() == 0
    _, items = tiny(maps, *padded_targets([[[0, 20, 20, 30, 34]]], 4))
    assert items[0] == 0 and items[2] == 0


def _logit(p):
    return math.log(p / (1 - p))


def _perfect(crit, family, maps, box, cls=0):
    """Set the prediction assigned to ``box`` (one gt) to decode to it exactly, with confident
    objectness and class."""
    targets, mask = padded_targets([[[cls] + box]], 1)
    gt = torch.tensor([[[(box[0] + box[2]) / 2, (box[1] + box[3]) / 2, box[2] - box[0], box[3] - box[1]]]])
    hw = [tuple(p.shape[-2:]) for p in maps]
    loc, live = crit._columns(gt, crit._anchor_choice(gt[..., 2:], mask), hw)
    flat_index = int(loc[0, 0][live[0, 0]][0])
    start = 0
    for head, p in zip(crit.heads, maps):
        na, (h, w) = len(head.anchors), p.shape[-2:]
        if flat_index < start + na * h * w:
            a, rest = divmod(flat_index - start, h * w)
            row, col = divmod(rest, w)
            fx, fy = gt[0, 0, 0] / head.stride - col, gt[0, 0, 1] / head.stride - row
            s = head.scale_x_y
            no = 5 + crit.nc
            v = p[0, a * no:(a + 1) * no, row, col]
            v[0] = _logit(((fx + (s - 1) / 2) / s).item())
            v[1] = _logit(((fy + (s - 1) / 2) / s).item())
            v[2] = math.log(gt[0, 0, 2] / head.anchors[a][0])
            v[3] = math.log(gt[0, 0, 3] / head.anchors[a][1])
            v[4] = 12.0
            v[5:] = -12.0
            v[5 + cls] = 12.0
            return
        start += na * h * w


@pytest.mark.parametrize("family", FAMILIES_T)
def test_a_perfect_prediction_costs_no_box_loss(family):
    crit = _crit(family)
    maps = [torch.zeros_like(m) for m in _maps(family, 1, torch.Generator().manual_seed(0))]
    for m in maps:                     # every other prediction: no object, a tiny box
        m.view(1, -1, 5 + NC, *m.shape[-2:])[:, :, 4] = -12.0
        m.view(1, -1, 5 + NC, *m.shape[-2:])[:, :, 2:4] = -6.0
    box = [10.0, 22.0, 34.0, 52.0]
    _perfect(crit, family, maps, box)
    _, items = crit(maps, *padded_targets([[[0] + box]], 4))
    assert items[0] < 1e-5, items
    assert items[1] < 1e-4 and items[2] < 1e-4, items


def test_region_loss_terms_by_hand():
    """YOLOv2-tiny, one 64 px image (2x2 cells x 5 anchors), one 24x16 gt centred on cell (0, 0),
    every logit 0: its best anchor is anchor 0 (shape IoU 0.6); box = the log-size errors (the
    offsets 0.5 are sigmoid(0): no cost) times 2 - w * h; class = CE of equal logits = log(nc)."""
    crit = _crit("yolo2")
    maps = [torch.zeros(1, 5 * (5 + NC), 2, 2)]
    box = [4.0, 8.0, 28.0, 24.0]       # centre (16, 16): cell (0, 0), 24x16 px = 0.75x0.5 cells
    _, items = crit(maps, *padded_targets([[[1] + box]], 2))
    assert items[2].item() == pytest.approx(math.log(NC) / 640, rel=1e-5)
    # box: offsets 0.5 = sigmoid(0) (no cost), log-size errors against tw = th = 0
    aw, ah = (a * 32 for a in cfgs.ANCHORS_V2[0])
    wh = 0.5 * (math.log(24 / aw) ** 2 + math.log(16 / ah) ** 2) * (2 - 24 * 16 / 64 ** 2)
    assert items[0].item() == pytest.approx(wh / 640, rel=1e-5)
    # objectness: every logit 0, so each weighted BCE is log 2: object_scale 5 at the assigned
    # prediction (target: its IoU), 1 at the 19 others unless their box overlaps the gt > 0.6
    assert items[1].item() == pytest.approx((5 + 19) * math.log(2) / 640, rel=1e-5)


def test_ignore_threshold_drops_the_no_object_loss_of_overlapping_predictions():
    """YOLOv3-tiny: the gt's own prediction (stride 16, anchor 1, row 2, col 1) decodes to it
    exactly; anchor 2 at that cell is made to decode to the same box (IoU 1 > 0.7), so its
    objectness has no no-object loss: raising it changes nothing. Raising anchor 2's objectness at
    another cell (no overlap) does."""
    crit = _crit("yolo3")
    maps = [torch.zeros_like(m) for m in _maps("yolo3", 1, torch.Generator().manual_seed(0))]
    box = [10.0, 22.0, 34.0, 52.0]
    _perfect(crit, "yolo3", maps, box)
    tg = padded_targets([[[0] + box]], 2)
    p = maps[1].view(1, 3, 5 + NC, 4, 4)                 # stride 16: anchors (10,14), (23,27), (37,58)
    with torch.no_grad():
        p[0, 2, :2, 2, 1] = p[0, 1, :2, 2, 1]
        p[0, 2, 2, 2, 1] = p[0, 1, 2, 2, 1] + math.log(23 / 37)
        p[0, 2, 3, 2, 1] = p[0, 1, 3, 2, 1] + math.log(27 / 58)
        first = crit(maps, *tg)[1][1]
        p[0, 2, 4, 2, 1] = 5.0
        second = crit(maps, *tg)[1][1]
        p[0, 2, 4, 0, 3] = 5.0
        third = crit(maps, *tg)[1][1]
    assert torch.equal(first, second) and third > second


def test_the_last_ground_truth_on_a_prediction_sets_its_box_and_the_classes_join():
    """Two gts with the same centre cell and best anchor: the prediction's box target is the
    second's (as Darknet's loop overwrites) and its class targets are both classes."""
    crit = _crit("yolo3")
    maps = _maps("yolo3", 1, torch.Generator().manual_seed(0))
    a = [0, 8.0, 25.0, 32.0, 55.0]
    b = [2, 9.0, 26.0, 31.0, 54.0]
    _, both = crit(maps, *padded_targets([[a, b]], 2))
    _, only_b = crit(maps, *padded_targets([[[0] + b[1:], b]], 2))
    assert both[0] == only_b[0]                         # the box term follows the last gt
    _, one = crit(maps, *padded_targets([[b]], 1))
    assert both[0] == one[0] and both[2] != one[2]      # the class term sees class 0 too


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.parametrize("family", FAMILIES_T)
def test_gradients_flow_and_shapes_are_fixed(family):
    maps = [m.requires_grad_() for m in _maps(family, 3, torch.Generator().manual_seed(2), scale=2.0)]
    crit = _crit(family)
    other = [[[1, 20, 20, 30, 40]], [[0, 2, 2, 60, 12], [2, 40, 40, 63, 63]], []]
    assert_fixed_shapes_and_finite_backward(lambda t, m: crit(maps, t, m), maps, 3, (RC, other))
    assert all(m.grad.abs().sum() > 0 for m in maps)


@pytest.mark.parametrize("family", FAMILIES_T)
def test_autocast_computes_in_float32(family):
    tg = padded_targets(RC[:1] + RC[2:], 8)
    assert_autocast_computes_in_float32(_crit(family), _maps(family, 2, torch.Generator().manual_seed(3)), tg)


def test_graph_safe_source():
    assert_no_host_sync(DarknetLoss.forward, DarknetLoss._compute, DarknetLoss._columns, DarknetLoss._anchor_choice,
                        head_tables, join_heads)


@pytest.mark.parametrize("family", FAMILIES_T)
def test_loss_fits_one_batch(family):
    """The loss learns: the tiny network fits one batch (the bar of the other families' tests)."""
    crit = _crit(family)

    def make():
        net = get_family(family).build_network("t", NC)
        net.initialize_biases(0.01)
        return net
    losses, _ = fit_one_batch(make, crit, lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), 12, seed=1)
    assert min(losses[-3:]) < 0.7 * losses[0], losses


def test_loss_scale_and_optimizer_follow_the_cfgs():
    """Darknet's per-image sums over 640, so that the trainer's step at lr0 = 10 x the cfg's
    learning_rate (nominal batch 64) is Darknet's; YOLOv4 weights CIoU by iou_normalizer 0.07."""
    net = _meta_net("yolo4", "b", 20)
    crit = DarknetLoss(net.heads, net.cfg, 20)
    assert crit.normalizer == 640 and crit.box_scale == 0.07 and crit.box_kind == "ciou" and crit.iou_thresh == 0.213
    v3 = _crit("yolo3")
    assert v3.box_scale == 1.0 and v3.box_kind == "coord" and v3.iou_thresh == 1.0 and v3.ignore_thresh == 0.7
    v2 = _crit("yolo2")
    assert v2.rescore and (v2.object_scale, v2.noobject_scale, v2.ignore_thresh) == (5.0, 1.0, 0.6)
    want = {("yolo2", "t"): (0.01, 0.9), ("yolo3", "b"): (0.01, 0.9), ("yolo4", "b"): (0.013, 0.949),
            ("yolo4", "t"): (0.0261, 0.9)}
    for (family, size), (lr0, momentum) in want.items():
        cls = get_family(family)     # train_defaults reads the class's cfgs and the size only
        d = cls.train_defaults(SimpleNamespace(CFGS=cls.CFGS, size=size, TRAIN_DEFAULTS=cls.TRAIN_DEFAULTS))
        assert d["optimizer"] == "SGD" and d["lr0"] == pytest.approx(lr0) and d["momentum"] == momentum


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES_T)
def test_cuda_graph_capture_matches_eager(family):
    """The loss forward+backward captured in a CUDA graph; replays with new targets == eager."""
    crit = _crit(family).cuda()
    maps = [m.cuda().requires_grad_() for m in _maps(family, 3, torch.Generator().manual_seed(0))]
    assert_graph_replay_matches_eager(lambda t, m: crit(maps, t, m), maps, cuda_batches(RC))


# ---------------------------------------------------------------------------------- predict
def _confident(model, family):
    """Untrained heads with objectness and class 0 lifted, so that predict has boxes to return."""
    with torch.no_grad():
        for h in model.model.heads:
            b = model.model.body.layers[h.layer].conv.bias.view(len(h.anchors), -1)
            b[:, 4] = 4.0
            b[:, 5] = 8.0 if family == "yolo2" else 4.0
    return model


@pytest.mark.parametrize("family", FAMILIES_T)
def test_predict_on_the_sample_image_and_checkpoint_round_trip(family, tmp_path):
    model = _confident(LibreYOLO.new(family, "t", device="cpu", seed=0), family)
    assert model.imgsz == 416 and model.preprocess.pad == 128.0
    img = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    r = model(img, conf=0.3, imgsz=160)
    assert 0 < len(r) <= 300 and r.boxes.data.shape[1] == 6
    h, w = r.orig_shape
    xyxy = r.boxes.xyxy
    assert (xyxy[:, 0] >= 0).all() and (xyxy[:, 2] <= w).all() and (xyxy[:, 3] <= h).all()
    assert (r.boxes.cls == 0).all() and (r.boxes.conf >= 0.3).all()
    path = model.save(tmp_path / "m.pt")
    raw = torch.load(path, weights_only=True)
    assert (raw["model_family"], raw["size"], raw["nc"]) == (family, "t", 80)
    back = LibreYOLO(str(path), device="cpu")
    assert type(back) is type(model) and back.trained
    for (k, a), (k2, b) in zip(model.model.state_dict().items(), back.model.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    assert torch.equal(back(img, conf=0.3, imgsz=160).boxes.data, r.boxes.data)
    # a bare state dict: family and size from its keys
    torch.save({"model": model.model.state_dict()}, tmp_path / "anonymous.pt")
    anon = LibreYOLO(str(tmp_path / "anonymous.pt"), device="cpu")
    assert (anon.FAMILY, anon.size, anon.nc) == (family, "t", 80)


def test_batched_equals_one_by_one():
    from libreyolo.ops.letterbox import letterbox
    model = _confident(LibreYOLO.new("yolo4", "t", device="cpu", seed=0), "yolo4")
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    imgs = [np.asarray(pil), np.asarray(pil.resize((500, 400)))]
    x = torch.cat([letterbox(torch.from_numpy(im.copy()).unsqueeze(0), 128, model.resize, pad=128.0) for im in imgs])
    with torch.no_grad():
        many = model.infer(x)
        for i in range(len(imgs)):
            for a, b in zip(model.infer(x[i:i + 1]), many):
                assert torch.allclose(a[0].float(), b[i].float(), atol=1e-4)


def test_the_letterbox_pads_with_grey_128():
    model = LibreYOLO.new("yolo3", "t", device="cpu", seed=0)
    img = torch.full((1, 50, 100, 3), 255, dtype=torch.uint8)
    x = model.preprocess(img, 64)
    assert torch.allclose(x[0, :, 40:, :], torch.full_like(x[0, :, 40:, :], 128 / 255))
    assert torch.allclose(x[0, :, :32, :], torch.ones_like(x[0, :, :32, :]))


def test_untrained_training_start_sets_the_prior_biases():
    model = LibreYOLO.new("yolo3", "t", nc=4, device="cpu", seed=0)
    assert model.init_for_training(model.model) == 2
    logit = math.log(0.01 / 0.99)
    for h in model.model.heads:
        b = model.model.body.layers[h.layer].conv.bias.view(3, 9)
        assert torch.allclose(b[:, 4:], torch.full_like(b[:, 4:], logit))
    v2 = LibreYOLO.new("yolo2", "t", nc=4, device="cpu", seed=0)
    bias = v2.model.body.layers[14].conv.bias.view(5, 9).clone()
    v2.init_for_training(v2.model)
    after = v2.model.body.layers[14].conv.bias.view(5, 9)
    assert torch.allclose(after[:, 4], torch.full((5,), logit)) and torch.equal(after[:, 5:], bias[:, 5:])


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES_T)
def test_ten_epochs_on_shapes_raise_map50(tmp_path, family):
    """Ten CPU epochs on the built-in shapes set (96 images at 160 px, batch 8, the cfg's SGD
    recipe): the training loss falls and the validation mAP50 rises above the untrained model's
    (about 80-110 s per family on one core; two epochs do not lift it, as for the other
    detectors)."""
    from libreyolo.data.synthetic import make_shapes_dataset
    data = str(make_shapes_dataset(tmp_path / "ds", n_train=96, n_val=16, imgsz=160, seed=0))
    untrained = LibreYOLO.new(family, "t", nc=5, device="cpu", seed=0)
    before = untrained.val(data=data, imgsz=160, batch=8, workers=0)["map50"]
    model = LibreYOLO.new(family, "t", device="cpu", seed=0)
    res = model.train(data=data, epochs=10, batch=8, imgsz=160, workers=0, project=str(tmp_path), name="run",
                      close_mosaic=0, warmup_epochs=0.5, verbose=False, seed=0, nbs=8, plots=False)
    total = [sum(epoch) for epoch in res["losses"]]
    assert total[-1] < total[0], res["losses"]
    assert res["map50"] > before, (res["map50"], before)
    back = LibreYOLO(res["last"], device="cpu")
    assert (back.FAMILY, back.size, back.nc) == (family, "t", 5)
