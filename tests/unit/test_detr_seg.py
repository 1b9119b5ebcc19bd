"""DETR instance segmentation (task ``segment``: D-FINE-seg): variant resolution, predict, round trip.

The fixture reproduction is a row of ``rows.FIXTURES`` (tests/unit/test_fixtures.py); the mask
loss and training are in tests/unit/test_detr_mask_loss.py.
"""
import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.deim.model import Deim
from libreyolo.models.dfine.model import Dfine
from libreyolo.models.dfine.seg import DfineSeg
from libreyolo.results import Results
from libreyolo.tasks.segment import InstanceMasks


@pytest.fixture(scope="module")
def seg_model():
    return LibreYOLO.new("dfine", "n", task="segment", nc=3, device="cpu", seed=0)


def test_dfine_serves_detect_and_segment_and_its_descendants_do_not_inherit_it():
    assert Dfine.for_task("segment") is DfineSeg and DfineSeg.for_task("detect") is Dfine
    with pytest.raises(ValueError, match="segment"):
        Deim.for_task("segment")


def test_infer_mask_parts_equal_the_networks_masks(seg_model):
    """Predict's (embedding, feature) factors of each picked (query, class) give the network's mask."""
    x = torch.rand(1, 3, 320, 320, generator=torch.Generator().manual_seed(0))
    net = seg_model.model.eval()
    with torch.no_grad():
        out = net(x)
        boxes, scores, cls, embed, feature = seg_model.infer(x)
    assert embed.shape == (1, 300, 128) and feature.shape == (1, 128, 80, 80)
    query = out["pred_logits"].sigmoid().flatten(1).topk(300, dim=1).indices // 3
    logits = seg_model.mask_logits(feature[0], embed[0])
    torch.testing.assert_close(logits.sigmoid(), out["pred_masks"][0][query[0]], rtol=1e-5, atol=1e-6)


def test_predict_gives_masks_at_the_original_size_without_nms(seg_model):
    img = (np.random.default_rng(0).random((90, 120, 3)) * 255).astype(np.uint8)
    r = seg_model(img, imgsz=320, conf=0.0, max_det=6)
    assert isinstance(r, Results) and len(r.boxes) == 6 and isinstance(r.masks, InstanceMasks)
    assert r.masks.shape == (6, 90, 120) and r.masks.data.dtype == torch.bool
    assert r.masks.cls.tolist() == r.boxes.cls.to(torch.int64).tolist()
    assert r.boxes.conf.tolist() == sorted(r.boxes.conf.tolist(), reverse=True)


def test_saved_segment_model_loads_back_as_segment(tmp_path, seg_model):
    back = LibreYOLO(str(seg_model.save(tmp_path / "seg.pt")), device="cpu")
    assert type(back) is DfineSeg and back.nc == 3 and back.task == "segment"
    a, b = seg_model.model.state_dict(), back.model.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
