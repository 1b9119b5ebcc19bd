"""SAM 2 and EdgeTAM on images, on the CPU: our two stages equal transformers' one forward, predict
with points and boxes (Python and CLI), checkpoints at another frame, bad input.

The fixtures (tests/unit/test_fixtures.py, rows sam2-tiny / edgetam-edge) run the 1024 frame and are
marked slow; here the same code runs at a 128 frame so each family costs about a second."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo import LibreYOLO

SIZE = 128
FAMILIES = [("sam2", "tiny"), ("edgetam", "edge")]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f for f, _ in FAMILIES])
def model(request):
    fam, size = request.param
    from libreyolo.models.registry import get_family
    return get_family(fam).new(size, device="cpu", imgsz=SIZE, seed=0, video=False)


@pytest.fixture(scope="module")
def image():
    img = np.full((90, 160, 3), 30, np.uint8)
    img[20:70, 30:100] = (220, 40, 40)
    return img


def _reference_class(net):
    """transformers' own image model class of ``net`` (its base)."""
    return next(c for c in type(net).__mro__ if c.__module__.startswith("transformers.models."))


def test_two_stages_equal_transformers_forward(model):
    """embed + decode (an image embedded once, prompted many times) == the transformers model's
    forward on the same weights, bit for bit: points, a box with points, multimask or not."""
    net = model.model
    g = torch.Generator().manual_seed(0)
    x = torch.randn((1, 3, SIZE, SIZE), generator=g)
    pts = torch.tensor([[[[20.0, 30.0], [90.0, 60.0]]]])
    lab = torch.tensor([[[1, 0]]])
    box = torch.tensor([[[10.0, 12.0, 100.0, 90.0]]])
    with torch.no_grad():
        embs = net.embed(x)
        for kw, mm in (({"input_points": pts, "input_labels": lab}, True),
                       ({"input_points": pts, "input_labels": lab, "input_boxes": box}, False),
                       ({"input_boxes": box}, True)):
            ref = _reference_class(net).forward(net, pixel_values=x, multimask_output=mm, **kw)
            low, iou, obj = net.decode(*embs, kw.get("input_points", [None])[0] if "input_points" in kw else None,
                                       lab[:, 0] if "input_points" in kw else None, kw.get("input_boxes"), mm)
            assert torch.equal(low, ref.pred_masks[:, 0]) and torch.equal(iou, ref.iou_scores[:, 0])
            assert torch.equal(obj, ref.object_score_logits)
            for ours, theirs in zip(embs, ref.image_embeddings):
                assert torch.equal(ours, theirs)


def test_predict_points_boxes_and_set_image(model, image):
    r = model(image, points=[[60, 45]], labels=[1], bgr=False)
    assert r.masks.data.shape == (3, 90, 160) and r.masks.data.dtype == torch.bool
    assert r.masks.scores.shape == (3,)
    one = model(points=[[60, 45], [5, 5]], labels=[1, 0], boxes=[[30, 20, 100, 70]], multimask=False)
    assert one.masks.data.shape == (1, 90, 160)
    box = model(boxes=[[30, 20, 100, 70]])
    assert box.masks.data.shape == (3, 90, 160) and len(box.masks.boxes) == 1
    # the set image's embedding is reused: the same prompt gives the same masks
    again = model(points=[[60, 45]], labels=[1])
    assert torch.equal(again.masks.data, r.masks.data) and torch.equal(again.masks.scores, r.masks.scores)
    # masks follow transformers' post-processing: the low-resolution logits straight to the image size
    st = model.get_predictor().current
    low, _ = model.decode(st.embedding, torch.tensor([[[60 * SIZE / 160, 45 * SIZE / 90]]]),
                          torch.ones(1, 1), None, True, SIZE)
    assert torch.equal(F.interpolate(low, (90, 160), mode="bilinear", align_corners=False)[0] > 0, r.masks.data)


def test_bad_input_is_named(model, image):
    model.set_image(image, bgr=False)
    with pytest.raises(ValueError, match="at most one box"):
        model(boxes=[[0, 0, 10, 10], [5, 5, 20, 20]])
    with pytest.raises(ValueError, match="outside the 160x90 image"):
        model(points=[[200, 10]])
    with pytest.raises(ValueError, match="takes 128x128 frames"):
        model(image, points=[[10, 10]], imgsz=256)
    with pytest.raises(ValueError, match="image network only"):
        model.track([image] * 2, points=[[10, 10]])


def test_checkpoint_keeps_its_frame_and_cli_predicts(tmp_path, model, image):
    """A saved model reloads at its frame (imgsz in the file); the CLI predicts with a prompt."""
    from libreyolo.cli import main
    path = model.save(tmp_path / f"{model.FAMILY}.pt")
    back = LibreYOLO(str(path), device="cpu")
    assert (back.FAMILY, back.imgsz, back.has_video) == (model.FAMILY, SIZE, False)
    src = tmp_path / "img.png"
    Image.fromarray(image).save(src)
    out = tmp_path / "pred"
    assert main(["predict", f"model={path}", f"source={src}", f"imgsz={SIZE}", "device=cpu",
                 "points=60,45;5,5", "labels=1,0", f"save_dir={out}", f"json={tmp_path / 'r.json'}"]) == 0
    assert (out / "img.jpg").exists()
    rows = json.loads((tmp_path / "r.json").read_text())[0]["detections"]
    assert [d["name"] for d in rows] == ["mask0", "mask1", "mask2"]


def test_video_network_holds_the_image_layout():
    """The video network's state dict is the image network's plus the memory modules (same
    names), so an image checkpoint's weights are the video model's image half; the sizes follow
    the SAM 2.1 releases (parameters of the video models)."""
    from libreyolo.models.sam2.nn import Sam2ImageNet, Sam2VideoNet
    with torch.device("meta"):
        img, vid = Sam2ImageNet("tiny", 1024), Sam2VideoNet("tiny", 1024)
        counts = {s: sum(p.numel() for p in Sam2VideoNet(s, 1024).parameters())
                  for s in ("small", "base-plus", "large")}
    assert set(img.state_dict()) < set(vid.state_dict())
    assert sum(p.numel() for p in vid.parameters()) == 38_962_498
    assert counts == {"small": 46_060_354, "base-plus": 80_850_178, "large": 224_446_642}
