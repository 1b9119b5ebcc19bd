"""YOLOv7 OTA loss: candidate columns, assignment, loss terms, padding, graph-safety, training."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from loss_cases import (
    assert_autocast_computes_in_float32,
    assert_fixed_shapes_and_finite_backward,
    assert_graph_replay_matches_eager,
    assert_no_host_sync,
    assert_padding_invariant,
    cuda_batches,
    fit_maps,
    loss_without_objects,
    padded_targets,
)

from libreyolo import LibreYOLO
from libreyolo.models.common import assign as assign_module
from libreyolo.models.yolo7.loss import HYPERPARAMETERS, Yolo7Loss
from libreyolo.models.yolo7.nn import ANCHORS

NC = 2
SIZES = (8, 4, 2)          # a 64x64 input at strides 8, 16, 32
STRIDES = (8, 16, 32)
NA = 3


def _maps(b: int, gen: torch.Generator, nc: int = NC, scale: float = 1.0) -> list[torch.Tensor]:
    return [torch.randn(b, NA * (5 + nc), s, s, generator=gen) * scale for s in SIZES]


def _live_columns(crit: Yolo7Loss, box: list[float]) -> set[tuple[int, int, int, int]]:
    """The (level, anchor, col, row) of the live candidate columns of one gt."""
    t, mask = padded_targets([[[0] + box]], 1)
    x1, y1, x2, y2 = box
    cxcywh = torch.tensor([[[(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]]])
    loc, live, cell, anchor, level = crit._columns(cxcywh, mask, [(s, s) for s in SIZES])
    starts = [0, NA * 64, NA * 64 + NA * 16]
    out = []
    for k in live[0].nonzero().flatten().tolist():
        lvl = int(level[k])
        n = SIZES[lvl]
        a, rest = divmod(int(loc[0, k]) - starts[lvl], n * n)
        row, col = divmod(rest, n)
        assert (col, row) == tuple(int(v) for v in cell[0, k])
        torch.testing.assert_close(anchor[k], torch.tensor(ANCHORS[lvl][a], dtype=torch.float32) / STRIDES[lvl])
        out.append((lvl, a, col, row))
    return out


BOX = [6.0, 10.0, 30.0, 50.0]     # centre (18, 30), 24 x 40 px

# BOX's candidates, by hand. Stride 8: centre (2.25, 3.75) in cells -> its cell (2, 3); x fraction
# 0.25 < 0.5 -> left (1, 3); y fraction 0.75, and 8 - 3.75 = 4.25 has fraction 0.25 -> down
# (2, 4); 24x40 is within 4x of all three anchors (12,16), (19,36), (40,28). Stride 16: centre
# (1.125, 1.875) -> (1, 1), left (0, 1), down (1, 2); all three anchors fit. Stride 32: 24 px is
# more than 4x smaller than 142, 192 and 459 -> none.
BOX_COLUMNS = {(lvl, a, col, row) for lvl, cells in ((0, ((2, 3), (1, 3), (2, 4))), (1, ((1, 1), (0, 1), (1, 2))))
               for a in range(3) for col, row in cells}


def test_candidate_columns_by_hand():
    cols = _live_columns(Yolo7Loss(NC, imgsz=64), BOX)
    assert len(cols) == len(set(cols)) == 18
    assert set(cols) == BOX_COLUMNS


def test_candidate_columns_on_cell_edges_as_in_the_original():
    """A centre exactly on a cell corner, (24, 24) = (3.0, 3.0) cells at stride 8: the fraction
    0 is < 0.5 from both sides, so left, up, right and down are all live, and right / down
    truncate back to the centre's own cell (the original's quirk: that cell appears 3 times)."""
    cols = _live_columns(Yolo7Loss(NC, imgsz=64), [16.0, 16.0, 32.0, 32.0])
    level0 = [c for c in cols if c[0] == 0]
    assert len(level0) == 15                       # 3 anchors x 5 options
    for a in range(3):
        cells = sorted((col, row) for lvl, aa, col, row in level0 if aa == a)
        assert cells == [(2, 3), (3, 2), (3, 3), (3, 3), (3, 3)]


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _set_prediction(maps, lvl: int, a: int, col: int, row: int, box: list[float], nc: int = NC) -> None:
    """Make the prediction at (level, anchor, cell) decode to ``box`` exactly."""
    s = STRIDES[lvl]
    x1, y1, x2, y2 = box
    rel_x, rel_y = (x1 + x2) / 2 / s - col, (y1 + y2) / 2 / s - row
    aw, ah = (v / s for v in ANCHORS[lvl][a])
    ch = a * (5 + nc)
    vals = (_logit((rel_x + 0.5) / 2), _logit((rel_y + 0.5) / 2),
            _logit(math.sqrt((x2 - x1) / s / aw) / 2), _logit(math.sqrt((y2 - y1) / s / ah) / 2))
    for i, v in enumerate(vals):
        maps[lvl][0, ch + i, row, col] = v


def _tiny_box_maps(nc: int = NC) -> list[torch.Tensor]:
    """Every prediction a near-empty box (wh logits -10), objectness and classes at logit 0."""
    maps = [torch.zeros(1, NA * (5 + nc), s, s) for s in SIZES]
    for m in maps:
        m.view(1, NA, 5 + nc, *m.shape[-2:])[:, :, 2:4] = -10.0
    return maps


def test_assignment_and_terms_by_hand():
    """Three of BOX's 18 columns predict it exactly, a fourth a box of IoU 0.5 (half as wide,
    same centre), the rest near-empty boxes. The sum of the 10 best IoUs is 3.5 -> k = 3: the
    three exact ones match. Then box loss 0 (CIoU 1); every objectness and class logit is 0,
    so each BCE is log 2 whatever its target: obj = (4 + 1 + 0.4) log 2, cls = log 2 per level
    with matches (levels 0 and 1)."""
    crit = Yolo7Loss(NC, imgsz=64)
    maps = _tiny_box_maps()
    perfect = [(0, 1, 2, 3), (0, 2, 1, 3), (1, 0, 1, 2)]
    for lvl, a, col, row in perfect:
        _set_prediction(maps, lvl, a, col, row, BOX)
    _set_prediction(maps, 1, 1, 1, 1, [12.0, 10.0, 24.0, 50.0])    # IoU 0.5 with BOX
    loss, items = crit(maps, *padded_targets([[[1] + BOX]], 4))
    box, obj, cls = items.tolist()
    assert box < 1e-6
    assert obj == pytest.approx(5.4 * math.log(2) * crit.obj_gain, rel=1e-5)
    assert cls == pytest.approx(2 * math.log(2) * crit.cls_gain, rel=1e-5)
    assert loss.item() == pytest.approx(sum(items.tolist()), rel=1e-6)      # batch size 1
    # the objectness target: 1 (the CIoU) at the three matched predictions, 0 elsewhere
    flat = torch.cat([m.view(1, NA, 5 + NC, s, s).permute(0, 1, 3, 4, 2).reshape(1, -1, 5 + NC)
                      for m, s in zip(maps, SIZES)], 1)
    flat[..., 4] = torch.randn(flat.shape[1], generator=torch.Generator().manual_seed(0))
    new_maps = [f.reshape(1, NA, s, s, 5 + NC).permute(0, 1, 4, 2, 3).reshape(1, -1, s, s)
                for f, s in zip(flat.split([NA * s * s for s in SIZES], 1), SIZES)]
    _, items2 = crit(new_maps, *padded_targets([[[1] + BOX]], 4))   # objectness does not change the match
    tobj = torch.zeros(flat.shape[1])
    starts = [0, NA * 64, NA * 64 + NA * 16]
    for lvl, a, col, row in perfect:
        tobj[starts[lvl] + (a * SIZES[lvl] + row) * SIZES[lvl] + col] = 1.0
    bce = F.binary_cross_entropy_with_logits(flat[0, :, 4], tobj, reduction="none")
    want = sum(w * bce[st:st + NA * s * s].mean() for w, st, s in zip((4.0, 1.0, 0.4), starts, SIZES))
    assert items2[1].item() == pytest.approx(want.item() * crit.obj_gain, rel=1e-5)


def test_perfect_prediction_everywhere_gives_zero_box_loss():
    crit = Yolo7Loss(NC, imgsz=64)
    maps = _tiny_box_maps()
    for lvl, a, col, row in BOX_COLUMNS:
        _set_prediction(maps, lvl, a, col, row, BOX)
    _, items = crit(maps, *padded_targets([[[0] + BOX]], 4))
    assert items[0] < 1e-6 and items[1] > 0 and items[2] > 0


# loss_cases' ROWS / OTHER_ROWS with the classes of NC = 2
ROWS = [[[0, 4, 6, 40, 50], [1, 30, 20, 62, 60], [1, 10, 30, 30, 62]],
        [],                                                   # an image with no objects
        [[1, 2, 2, 60, 62]]]
OTHER_ROWS = [[[1, 20, 20, 30, 40]], [[0, 2, 2, 60, 12], [1, 40, 40, 63, 63]], []]


def test_padding_rows_change_nothing():
    gen = torch.Generator().manual_seed(0)
    maps = _maps(3, gen)
    items = assert_padding_invariant(lambda t, m: Yolo7Loss(NC, imgsz=64)(maps, t, m), ROWS, atol=1e-8)
    assert (items > 0).all()


def test_no_targets_gives_objectness_only():
    gen = torch.Generator().manual_seed(1)
    maps = _maps(2, gen)
    crit = Yolo7Loss(NC, imgsz=64)
    l0, i0 = loss_without_objects(lambda t, m: crit(maps, t, m), 2)
    assert i0[0] == 0 and i0[2] == 0
    want = 0.0
    for w, m, s in zip((4.0, 1.0, 0.4), maps, SIZES):
        obj = m.view(2, NA, 5 + NC, s, s)[:, :, 4]
        want += w * F.binary_cross_entropy_with_logits(obj, torch.zeros_like(obj))
    torch.testing.assert_close(i0[1], want * crit.obj_gain)
    torch.testing.assert_close(l0, i0[1] * 2)                  # times the batch size


def test_single_class_has_no_class_loss():
    gen = torch.Generator().manual_seed(2)
    crit = Yolo7Loss(1, imgsz=64)
    rows = [[[0] + r[1:] for r in img] for img in ROWS]
    _, items = crit(_maps(3, gen, nc=1), *padded_targets(rows, 8))
    assert items[2] == 0 and items[0] > 0 and items[1] > 0


def test_gains_follow_the_hyp_files():
    crit = Yolo7Loss(20, imgsz=320, **HYPERPARAMETERS["b"])
    assert crit.box_gain == pytest.approx(0.05)
    assert crit.obj_gain == pytest.approx(0.7 * 0.25)
    assert crit.cls_gain == pytest.approx(0.3 * 20 / 80)
    assert HYPERPARAMETERS["tiny"] == {"box": 0.05, "obj": 1.0, "cls": 0.5}


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_gradients_flow_and_shapes_are_fixed():
    gen = torch.Generator().manual_seed(2)
    maps = [m.requires_grad_() for m in _maps(3, gen, scale=2.0)]
    crit = Yolo7Loss(NC, imgsz=64)
    assert_fixed_shapes_and_finite_backward(lambda t, m: crit(maps, t, m), maps, 3, (ROWS, OTHER_ROWS))
    assert all(m.grad.abs().sum() > 0 for m in maps)


def test_autocast_computes_in_float32():
    gen = torch.Generator().manual_seed(3)
    tg = padded_targets(ROWS[:1] + ROWS[2:], 8)
    assert_autocast_computes_in_float32(Yolo7Loss(NC, imgsz=64), _maps(2, gen), tg)


def test_graph_safe_source():
    # the constructor builds its constants with torch.tensor (once, on the host): check the rest
    assert_no_host_sync(Yolo7Loss.forward, Yolo7Loss._compute, Yolo7Loss._columns, assign_module)


def test_loss_trains_the_maps():
    losses = fit_maps(Yolo7Loss(NC, imgsz=64), _maps(2, torch.Generator().manual_seed(4)), ROWS)
    assert losses[-1] < 0.5 * losses[0], losses


def test_model_builds_the_loss_for_its_size_and_imgsz():
    model = LibreYOLO.new("yolo7", "tiny", nc=NC, imgsz=320, device="cpu", seed=0)
    crit = model.build_loss()
    assert isinstance(crit, Yolo7Loss) and crit.item_names == ("box", "obj", "cls")
    assert crit.obj_gain == pytest.approx(1.0 * 0.25) and crit.cls_gain == pytest.approx(0.5 * NC / 80)
    outputs = model.train_forward(model.model.train(), torch.rand(1, 3, 64, 64), None, None)
    _, items = crit(outputs, *padded_targets([[[1] + BOX]], 4))
    assert torch.isfinite(items).all()


@pytest.mark.cuda
def test_cuda_graph_capture_matches_eager():
    """Capture the loss forward+backward in a CUDA graph; replays with new targets == eager."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    crit = Yolo7Loss(NC, imgsz=64).to(dev)
    maps = [m.to(dev).requires_grad_() for m in _maps(3, gen)]
    assert_graph_replay_matches_eager(lambda t, m: crit(maps, t, m), maps, cuda_batches(ROWS))
