"""The CNN families' decoders against their per-level formulas, and the letterbox against its
plain formula, bitwise.

The decoders join the levels and decode once over all anchors (fewer kernels in the captured
predict stage); these references decode level by level as the papers write it. Same operations
on the same numbers, so the outputs must be equal, not close, in float32 and float16.
"""
import pytest
import torch

from libreyolo import LibreYOLO

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def cells(h, w, offset=0.0, stride=1, dtype=torch.float32, device="cpu"):
    ys = (torch.arange(h, dtype=dtype, device=device) + offset) * stride
    xs = (torch.arange(w, dtype=dtype, device=device) + offset) * stride
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((gx, gy), -1).reshape(1, h * w, 2)


def yolox_reference(maps, strides=(8, 16, 32)):
    boxes, scores = [], []
    for m, s in zip(maps, strides):
        p = m.flatten(2).transpose(1, 2)
        xy = (p[..., 0:2] + cells(*m.shape[-2:], dtype=m.dtype, device=m.device)) * s
        half = torch.exp(p[..., 2:4]) * (s / 2)
        boxes.append(torch.cat((xy - half, xy + half), -1))
        scores.append(p[..., 4:5] * p[..., 5:])
    score, cls = torch.cat(scores, 1).max(-1)
    return torch.cat(boxes, 1), score, cls


def yolo7_reference(net, maps, strides=(8, 16, 32)):
    out = []
    for level, (p, s) in enumerate(zip(maps, strides)):
        b, _, h, w = p.shape
        y = p.reshape(b, net.na, 5 + net.nc, h, w).permute(0, 1, 3, 4, 2).sigmoid()
        grid = cells(h, w, dtype=y.dtype, device=y.device).reshape(1, 1, h, w, 2)
        anchor = net.anchors[level].to(y.dtype).reshape(1, net.na, 1, 1, 2)
        xy = (y[..., 0:2] * 2.0 - 0.5 + grid) * s
        wh = (y[..., 2:4] * 2.0) ** 2 * anchor
        out.append(torch.cat((xy, wh, y[..., 4:]), -1).reshape(b, -1, 5 + net.nc))
    pred = torch.cat(out, 1).float()
    cxcy, wh = pred[..., 0:2], pred[..., 2:4]
    best, cls = pred[..., 5:].max(-1)
    return torch.cat((cxcy - 0.5 * wh, cxcy + 0.5 * wh), -1), pred[..., 4] * best, cls


def distance_reference(cls_maps, box_maps, size, strides, offset, reg_max=None):
    boxes, logits = [], []
    for c, d, s in zip(cls_maps, box_maps, strides):
        b, _, h, w = d.shape
        if reg_max is None:
            dist = d.float().flatten(2).transpose(1, 2)
        else:
            d = d.float().reshape(b, 4, reg_max + 1, h * w).permute(0, 3, 1, 2)
            dist = (d.softmax(-1) * torch.arange(reg_max + 1, dtype=torch.float32, device=d.device)).sum(-1) * s
        pts = cells(h, w, offset, s, device=d.device)
        boxes.append(torch.cat((pts - dist[..., :2], pts + dist[..., 2:]), -1))
        logits.append(c.float().flatten(2).transpose(1, 2))
    scores, cls = torch.cat(logits, 1).sigmoid().max(-1)
    box = torch.cat(boxes, 1)
    box = torch.stack([box[..., i].clamp(0, size) for i in range(4)], -1)
    return box, scores, cls


def assert_equal(got, ref):
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert torch.equal(g, r), (g - r).abs().max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("size", [640, 416])
def test_yolox_decode_equals_per_level_formula(size, dtype, device):
    from libreyolo.models.yolox.nn import decode
    g = torch.Generator().manual_seed(size)
    maps = [torch.randn(2, 85, size // s, size // s, generator=g) for s in (8, 16, 32)]
    for m in maps:
        m[:, 4:] = m[:, 4:].sigmoid()
    maps = [m.to(device, dtype) for m in maps]
    assert_equal(decode(maps), yolox_reference(maps))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size", [640, 320])
def test_yolo7_decode_equals_per_level_formula(size, dtype, device):
    net = LibreYOLO.new("yolo7", "tiny", device=device, seed=0).model
    g = torch.Generator().manual_seed(size)
    maps = [(torch.randn(2, 3 * 85, size // s, size // s, generator=g) * 3).to(device, dtype) for s in (8, 16, 32)]
    assert_equal(net.decode(maps), yolo7_reference(net, maps))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("family,size,strides,offset,reg_max",
                         [("rtmdet", "t", (8, 16, 32), 0.0, None), ("picodet", "s", (8, 16, 32, 64), 0.5, 7)])
def test_distance_decoders_equal_per_level_formula(family, size, strides, offset, reg_max, dtype, device,
                                                   monkeypatch):
    m = LibreYOLO.new(family, size, device=device, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 416, 416, generator=g).to(device)
    with torch.no_grad():
        cls_maps, box_maps = m.model(m.normalize(x))
    cls_maps = [(c * 3).to(dtype) for c in cls_maps]
    box_maps = [(d if reg_max else d.abs() * 30).to(dtype) for d in box_maps]
    monkeypatch.setattr(m.model, "forward", lambda *_: (cls_maps, box_maps))
    with torch.no_grad():
        got = m.infer(x)
    assert_equal(got, distance_reference(cls_maps, box_maps, 416, strides, offset, reg_max))


def letterbox_reference(u8, size, mode):
    """To float, resize, pad with 114, divide by 255, written plainly (letterbox makes the float
    NCHW copy in one kernel instead of two)."""
    import torch.nn.functional as F

    from libreyolo.ops.letterbox import PAD_VALUE, letterbox_params
    _, h, w, _ = u8.shape
    p = letterbox_params(h, w, size, mode)
    x = u8.permute(0, 3, 1, 2).contiguous().float()
    if (p.new_h, p.new_w) != (h, w):
        x = F.interpolate(x, size=(p.new_h, p.new_w), mode="bilinear", align_corners=False)
    if (p.new_h, p.new_w) != (size, size):
        x = F.pad(x, (p.pad_x, size - p.new_w - p.pad_x, p.pad_y, size - p.new_h - p.pad_y), value=PAD_VALUE)
    return x.div_(255.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["topleft", "center", "stretch"])
@pytest.mark.parametrize("hw,batch", [((720, 1280), 1), ((300, 500), 2), ((160, 160), 1), ((161, 97), 1)])
def test_letterbox_equals_plain_formula(hw, batch, mode, device):
    from libreyolo.ops.letterbox import letterbox
    g = torch.Generator().manual_seed(hw[0])
    u8 = torch.randint(0, 256, (batch, *hw, 3), generator=g, dtype=torch.uint8).to(device)
    got = letterbox(u8, 160, mode)
    assert got.is_contiguous() and got.shape == (batch, 3, 160, 160)
    assert_equal([got], [letterbox_reference(u8, 160, mode)])
    if device == "cuda":  # inside predict's autocast as well
        with torch.autocast("cuda", dtype=torch.float16):
            assert_equal([letterbox(u8, 160, mode)], [letterbox_reference(u8, 160, mode)])


def test_letterbox_refuses_non_uint8():
    from libreyolo.ops.letterbox import letterbox
    with pytest.raises(ValueError, match="uint8"):
        letterbox(torch.zeros(1, 8, 8, 3), 32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["topleft", "center", "stretch"])
def test_boxes_mapped_back_in_the_stage_equal_the_host_mapping(mode, device):
    """unletterbox_packed (on the device, inside the predict stage) gives the numbers of the host's
    unletterbox_boxes, row for row, for a batch of images of different sizes."""
    import numpy as np

    from libreyolo.ops.letterbox import geometry_rows, letterbox_params, unletterbox_boxes, unletterbox_packed
    shapes, max_det = ((720, 1280), (517, 333), (640, 640)), 50
    g = torch.Generator().manual_seed(7)
    rows = torch.rand((3, max_det, 6), generator=g) * 900 - 100
    rows[0, 3, 0] = float("nan")
    packed = torch.cat((rows.reshape(3, -1), torch.full((3, 1), 17.0)), 1)
    geo = torch.tensor(geometry_rows(shapes, 640, mode), dtype=torch.float32, device=device)
    got = unletterbox_packed(packed.to(device), geo, max_det).cpu()
    assert torch.equal(got[:, -1], packed[:, -1]) and torch.equal(got[..., :-1].reshape(3, max_det, 6)[..., 4:],
                                                                  rows[..., 4:])
    for i, (h, w) in enumerate(shapes):
        p = letterbox_params(h, w, 640, mode)
        ref = unletterbox_boxes(rows[i].numpy().copy(), p.new_w / w, p.new_h / h, h, w, p.pad_x, p.pad_y)
        assert np.array_equal(got[i, :-1].reshape(max_det, 6).numpy(), ref, equal_nan=True), (i, mode)
