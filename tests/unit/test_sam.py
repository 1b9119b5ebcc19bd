"""SAM (transformers' SAM modules) on the CPU: the layout of every size, the fast twin of the
sam-base fixture (a small config against transformers' own SamModel), predict with points and
boxes through the two stages, set_image, bad input, the CLI.

The sam-base fixture itself runs at the fixed 1024 frame (about a minute on one core): its rows
in tests/unit/test_fixtures.py are slow (rows.SLOW_FIXTURES); the small config here (ViT width
32, two blocks, a 128 frame) checks the same code in well under a second."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers", reason="the sam extra (pip install 'libreyolo-graphs[sam]')")

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.models.sam.model import SAM  # noqa: E402
from libreyolo.models.sam.nn import SamImageEncoder, SamNet, SamSize, _rel_pos_on_device, sam_config  # noqa: E402
from libreyolo.ops.preprocess import long_side_size  # noqa: E402
from libreyolo.tasks.segment_prompt.predictor import postprocess_masks  # noqa: E402

SIZE = 128
SMALL = SamSize(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, global_attn_indexes=(1,))


def small_net(seed=0):
    torch.manual_seed(seed)
    return SamNet(sam_config(SMALL, image_size=SIZE, window_size=4))


@pytest.fixture(scope="module")
def model():
    from libreyolo.engine.verify import input_sensitive
    return input_sensitive(SAM(small_net(), size="base", imgsz=SIZE, device="cpu", trained=False), seed=1)


@pytest.fixture(scope="module")
def image():
    g = np.random.default_rng(0)
    img = np.zeros((90, 160, 3), np.uint8)
    img[20:70, 30:100] = (220, 40, 40)
    return np.clip(img + g.integers(0, 30, img.shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("size,params", [("base", 93_735_728), ("large", 312_343_088), ("huge", 641_090_864)])
def test_each_size_has_the_original_releases_layout(size, params):
    """Built on the meta device: transformers' SamModel state dict key for key (base: the
    fixture's layout, in order) and the original releases' parameter counts."""
    with torch.device("meta"):
        net = SAM.build_network(size)
        ref = transformers.SamModel(sam_config(size))
    assert [(k, tuple(v.shape)) for k, v in net.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    assert sum(p.numel() for p in net.parameters()) == params
    if size == "base":
        from conftest import FIXTURES_DIR
        layout = json.loads((FIXTURES_DIR / "sam-base.json").read_text())["layout"]
        assert [(k, tuple(v.shape)) for k, v in net.state_dict().items()] == [(n, tuple(s)) for n, s, _ in layout]
    assert net.prompt_encoder.shared_embedding is net.shared_image_embedding   # SamModel's tie


@pytest.mark.parametrize("q,k,length", [(14, 14, 27), (64, 64, 127), (8, 16, 31), (16, 8, 31)])
def test_relative_position_lookup_is_transformers_with_the_index_on_the_table_s_device(q, k, length):
    """transformers builds the index on the CPU (a host copy inside capture); ours on the table's
    device must pick the same rows: SAM's window (14) and global (64 at 1024) sizes, and unequal ones."""
    from transformers.models.sam.modeling_sam import SamVisionAttention
    table = torch.randn(length, 32)
    assert torch.equal(_rel_pos_on_device(None, q, k, table), SamVisionAttention.get_rel_pos(None, q, k, table))
    enc = SamImageEncoder(sam_config(SamSize(64, 2, 2, (1,)), image_size=128).vision_config)
    bound = [m for m in enc.modules() if "get_rel_pos" in vars(m)]
    assert len(bound) == 2 and all(m.get_rel_pos.__func__ is _rel_pos_on_device for m in bound)


def test_small_config_reproduces_transformers_sammodel():
    """The fixture's fast twin: our stages on a small config equal transformers' own SamModel
    forward (the reference call of the fixture: the normalized image padded to the frame, a
    point prompt, multimask) bit for bit, and so does a box prompt."""
    net = small_net().eval()
    ref = transformers.SamModel(sam_config(SMALL, image_size=SIZE, window_size=4)).eval()
    ref.load_state_dict(net.state_dict(), strict=True)
    g = torch.Generator().manual_seed(0)
    x = torch.rand((1, 3, 96, 128), generator=g)
    pts, lab = torch.tensor([[[[40.0, 60.0], [100.0, 30.0]]]]), torch.tensor([[[1, 0]]])
    with torch.no_grad():
        ours = net(x, pts, lab, multimask_output=True)
        theirs = ref(pixel_values=torch.nn.functional.pad(x, (0, 0, 0, 32)), input_points=pts, input_labels=lab,
                     multimask_output=True)
        assert torch.equal(ours["pred_masks"], theirs.pred_masks) and torch.equal(ours["iou_scores"], theirs.iou_scores)
        box = torch.tensor([[[10.0, 20.0, 90.0, 70.0]]])
        emb = net.embed(x * 0.5 + 0.2)
        low, iou = net.decode(emb, None, None, box, False)
        theirs = ref(image_embeddings=emb, input_boxes=box, multimask_output=False)
        assert torch.equal(low, theirs.pred_masks[:, 0]) and torch.equal(iou, theirs.iou_scores[:, 0])


def test_predict_equals_the_network_run_by_hand(model, image):
    """Image stage + prompt stage == resize -> embed -> decode (points and box scaled into the
    frame) -> SAM's mask post-processing, bit for bit; masks at the original size, one score each."""
    pts, lab, box = [[80, 45], [20, 80]], [1, 0], [[30, 20, 100, 70]]
    r = model(image, points=pts, labels=lab, boxes=box, color_format="rgb")
    rh, rw = long_side_size(90, 160, SIZE)
    net = model.model
    with torch.no_grad():
        x = model.preprocess(torch.from_numpy(image)[None], SIZE)
        emb = net.embed(x, SIZE)
        sx, sy = rw / 160, rh / 90
        p = torch.tensor([[[80 * sx, 45 * sy], [20 * sx, 80 * sy]]], dtype=torch.float32)
        b = torch.tensor([[[30 * sx, 20 * sy, 100 * sx, 70 * sy]]], dtype=torch.float32)
        low, iou = net.decode(emb, p, torch.tensor([[1.0, 0.0]]), b, True, SIZE)
        masks = postprocess_masks(low, SIZE, (rh, rw), (90, 160))
    assert r.masks.data.shape == (3, 90, 160) and r.masks.data.dtype == torch.bool
    assert torch.equal(r.masks.data, masks[0]) and torch.equal(r.masks.scores, iou[0])
    one = model(image, boxes=box, multimask=False).masks
    assert one.data.shape == (1, 90, 160) and one.scores.shape == (1,)


def test_set_image_then_prompts_reuse_the_embedding(model, image):
    model.set_image(image)
    calls = model.runner.eager_calls
    a = model(points=[[80, 45]])
    b = model(boxes=[[30, 20, 100, 70]])
    assert model.runner.eager_calls - calls == 2, "a prompt call on a set image runs the prompt stage only"
    again = model(image, points=[[80, 45]])
    assert torch.equal(a.masks.data, again.masks.data) and torch.equal(a.masks.scores, again.masks.scores)
    assert not torch.equal(a.masks.scores, b.masks.scores)


def test_automatic_masks(model, image):
    r = model(image, points_per_side=4, pred_iou_thresh=0, stability_score_thresh=0)
    assert type(r.masks).__name__ == "AutoMasks" and r.masks.data.shape[1:] == (90, 160)
    assert len(r.masks) >= 1 and (r.masks.areas == r.masks.data.sum((1, 2))).all()


@pytest.mark.parametrize("kw,match", [
    ({"points": [[161, 10]]}, r"prompt point 0 \(161, 10\) is outside the 160x90 image"),
    ({"boxes": [[0, 0, 200, 50]]}, "prompt box 0 .* is outside the 160x90 image"),
    ({"points": [[1, 1]], "imgsz": 256}, "SAM's frame is fixed at 128"),
])
def test_bad_input_is_refused_by_name(model, image, kw, match):
    with pytest.raises(ValueError, match=match):
        model(image, **kw)


def test_frame_is_fixed():
    with pytest.raises(ValueError, match="SAM's frame is fixed at 128"):
        SAM(small_net(), size="base", imgsz=256, device="cpu", trained=False)


def test_cli_predict_with_points_and_boxes(tmp_path, image, monkeypatch):
    """``libreyolo predict model=sam-base``, the network swapped for the small config (the real
    ViT-B at 1024 takes a minute on one core)."""
    from libreyolo.cli import main
    monkeypatch.setattr(SAM, "build_network", classmethod(lambda cls, size, nc=1: small_net()))
    src = tmp_path / "img.png"
    Image.fromarray(image).save(src)
    out = tmp_path / "pred"
    assert main(["predict", "model=sam-base", f"source={src}", "imgsz=128", "device=cpu", "points=80,45;10,10",
                 "labels=1,0", "boxes=30,20,100,70", f"save_dir={out}", f"json={tmp_path / 'r.json'}"]) == 0
    assert (out / "img.jpg").exists()
    rows = json.loads((tmp_path / "r.json").read_text())[0]["detections"]
    assert [d["name"] for d in rows] == ["mask0", "mask1", "mask2"]


def test_verify_cases_run_the_parity_protocol_on_the_cpu(model, monkeypatch):
    """The task's cases (network, image stage, prompt stage) run on SAM through the parity
    protocol, the capture stood in by a replay: probes differ, replays equal."""
    from standin import StandInCapturer

    import libreyolo.graphs.parity as parity
    monkeypatch.setattr(parity, "CudaGraphCapturer", StandInCapturer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cases = model.task_def.verify_cases(model, SIZE, 2, (48, 64))
    with torch.no_grad():
        results = [parity.check_parity(name, fn, a, b, module=model.model) for name, fn, a, b in cases]
    assert [c[0].split()[0] for c in cases] == ["network", "image-stage", "prompt-stage", "prompt-stage+mask"]
    assert all(r.passed for r in results), [r.as_dict() for r in results]


def test_family_is_named_and_sniffed():
    from libreyolo.models.registry import parse_spec
    assert parse_spec("sam-base") == (SAM, "base") and parse_spec("LibreSAM1huge.pt") == (SAM, "huge")
    with torch.device("meta"):
        sd = SAM.build_network("large").state_dict()
    assert SAM.owns_state_dict(sd) and SAM.sniff_size(sd, 1) == "large"
    assert LibreYOLO.__module__   # the factory is importable without building anything


def test_a_transformers_state_dict_with_the_tie_stored_once_loads(tmp_path, monkeypatch):
    """transformers' save_pretrained writes SamModel's tied Fourier matrix once (under
    shared_image_embedding): such a state dict loads, the prompt encoder's entry filled from it."""
    from safetensors.torch import save_file
    net = small_net(seed=3)
    monkeypatch.setattr(SAM, "build_network", classmethod(lambda cls, size, nc=1: small_net()))
    sd = {k: v for k, v in net.state_dict().items() if k not in SAM.TIED}
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    m = SAM.from_checkpoint({"model": sd, "size": "base", "imgsz": SIZE}, device="cpu")
    assert torch.equal(m.model.prompt_encoder.shared_embedding.positional_embedding,
                       net.shared_image_embedding.positional_embedding)
    m2 = LibreYOLO(str(tmp_path / "model.safetensors"), device="cpu", size="base")
    assert m2.FAMILY == "sam" and all(torch.equal(a, b) for a, b in zip(m2.model.state_dict().values(),
                                                                        net.state_dict().values()))
