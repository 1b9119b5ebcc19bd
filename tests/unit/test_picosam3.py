"""PicoSAM3 on the CPU: the box -> region rule, predict with boxes (one network forward per
box, the masks pasted back) against the steps run by hand, set_image, bad input (points, the
grid, empty boxes), the parity cases and the CLI. The network itself: tests/unit/test_fixtures.py."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.models.picosam3.model import PicoSAM3, roi_of_box
from libreyolo.ops.preprocess import IMAGENET_MEAN, IMAGENET_STD


@pytest.fixture(scope="module")
def model():
    from libreyolo.engine.verify import input_sensitive
    return input_sensitive(LibreYOLO.new("picosam3", "pico", device="cpu", seed=0), seed=1)


@pytest.fixture(scope="module")
def image():
    g = np.random.default_rng(0)
    img = np.zeros((90, 160, 3), np.uint8)
    img[20:70, 30:100] = (220, 40, 40)
    return np.clip(img + g.integers(0, 30, img.shape), 0, 255).astype(np.uint8)


def test_box_to_region_is_upstreams_rule():
    """Grown 10 % a side, squared about the centre, truncated to integers and clipped."""
    assert roi_of_box((30, 20, 100, 70), 160, 90) == (23, 3, 107, 87)          # 84 x 84 about (65, 45)
    assert roi_of_box((0, 0, 50, 50), 160, 90) == (0, 0, 55, 55)               # clipped at the top-left
    assert roi_of_box((150, 80, 160, 90), 160, 90) == (149, 79, 160, 90)
    with pytest.raises(ValueError, match="has no area"):
        roi_of_box((10, 10, 10, 40), 160, 90)


def test_predict_equals_the_steps_run_by_hand(model, image):
    """Each box: its region cut out, resized to 96 (PIL-style bilinear, whole levels),
    ImageNet-normalized, the network, its logits resized back onto the region and thresholded
    at 0; score = mean sigmoid over the mask. One mask per box, in the boxes' order."""
    boxes = [[30, 20, 100, 70], [0, 0, 50, 50]]
    r = model(image, boxes=boxes, color_format="rgb")
    m = r.masks
    assert m.data.shape == (2, 90, 160) and m.scores.shape == (2,) and len(m.boxes) == 2
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    for i, b in enumerate(boxes):
        x1, y1, x2, y2 = roi_of_box(b, 160, 90)
        crop = torch.from_numpy(image[y1:y2, x1:x2]).permute(2, 0, 1)[None].float()
        crop = F.interpolate(crop, (96, 96), mode="bilinear", align_corners=False, antialias=True).round().clamp(0, 255)
        with torch.no_grad():
            logits = model.model((crop / 255 - mean) / std)
        roi = F.interpolate(logits, (y2 - y1, x2 - x1), mode="bilinear", align_corners=False)[0, 0]
        want = torch.zeros(90, 160, dtype=torch.bool)
        want[y1:y2, x1:x2] = roi > 0
        assert torch.equal(m.data[i], want)
        score = roi.sigmoid()[roi > 0].mean() if (roi > 0).any() else torch.tensor(0.0)
        torch.testing.assert_close(m.scores[i], score, rtol=0, atol=1e-6)
        assert not m.data[i, :, x2:].any() and not m.data[i, y2:].any()        # nothing outside its region


def test_set_image_then_box_prompts(model, image):
    model.set_image(image)
    a = model(boxes=[[30, 20, 100, 70]])
    again = model(image, boxes=[[30, 20, 100, 70]])
    assert torch.equal(a.masks.data, again.masks.data) and torch.equal(a.masks.scores, again.masks.scores)
    assert not torch.equal(a.masks.data, model(boxes=[[60, 10, 150, 80]]).masks.data)


@pytest.mark.parametrize("kw,match", [
    ({"points": [[80, 45]]}, "PicoSAM3 takes box prompts only"),
    ({"points": [[80, 45]], "boxes": [[30, 20, 100, 70]]}, "PicoSAM3 takes box prompts only"),
    ({}, "picosam3 takes box prompts only: automatic mask generation"),
    ({"prompts": "grid"}, "picosam3 takes box prompts only: automatic mask generation"),
    ({"boxes": [[30, 20, 30, 70]]}, "has no area"),
    ({"boxes": [[30, 20, 200, 70]]}, "prompt box 0 .* is outside the 160x90 image"),
])
def test_bad_input_is_refused_by_name(model, image, kw, match):
    with pytest.raises(ValueError, match=match):
        model(image, **kw)


def test_verify_cases_run_the_parity_protocol_on_the_cpu(model, monkeypatch):
    from standin import StandInCapturer

    import libreyolo.graphs.parity as parity
    monkeypatch.setattr(parity, "CudaGraphCapturer", StandInCapturer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cases = model.task_def.verify_cases(model, 96, 2, (48, 64))
    assert [c[0].split()[0] for c in cases] == ["network", "roi-stage", "paste-stage"]
    with torch.no_grad():
        results = [parity.check_parity(name, fn, a, b, module=model.model) for name, fn, a, b in cases]
    assert all(r.passed for r in results), [r.as_dict() for r in results]


def test_cli_predict_with_boxes(tmp_path, image):
    from libreyolo.cli import main
    src = tmp_path / "img.png"
    Image.fromarray(image).save(src)
    out = tmp_path / "pred"
    assert main(["predict", "model=picosam3-pico", f"source={src}", "device=cpu", "boxes=30,20,100,70;0,0,50,50",
                 f"save_dir={out}", f"json={tmp_path / 'r.json'}"]) == 0
    assert (out / "img.jpg").exists()
    rows = json.loads((tmp_path / "r.json").read_text())[0]["detections"]
    assert [d["name"] for d in rows] == ["mask0", "mask1"]


def test_family_is_named_and_sniffed():
    from libreyolo.models.registry import parse_spec
    assert parse_spec("picosam3-pico") == (PicoSAM3, "pico") and parse_spec("LibrePicoSAM3pico.pt") == (PicoSAM3, "pico")
    assert PicoSAM3.owns_state_dict(PicoSAM3.build_network("pico").state_dict())
