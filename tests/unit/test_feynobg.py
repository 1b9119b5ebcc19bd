"""FeyNobg (matting) on the CPU: a declaration over BiRefNet's network - the size-l layout and
parameter count (meta device), checkpoint sniffing apart from BiRefNet, predict / the seam / the
CLI / the refusals on a tiny configuration of the same code. The fixture reproduction of size l
(262.8 M parameters) is the slow ``feynobg-l`` row of tests/unit/test_fixtures.py."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES_DIR
from PIL import Image
from standin import StandInCapturer

from libreyolo import LibreYOLO, cli
from libreyolo.models.birefnet.model import BiRefNet
from libreyolo.models.birefnet.nn import BiRefNetNet, SwinConfig, swin_depths
from libreyolo.models.feynobg.model import FeyNobg
from libreyolo.models.registry import family_for_checkpoint, get_family, list_models, parse_spec
from libreyolo.tasks.matte import Alpha

SIZE = 64
#: the same network code at a test's scale: a deeper third stage, as FeyNobg's, on a narrow Swin
TINY = SwinConfig(16, (2, 2, 4, 2), (1, 2, 4, 8), 4)


def tiny(seed=0):
    torch.manual_seed(seed)
    return FeyNobg(BiRefNetNet(TINY), size="l", nc=1, device="cpu", trained=False, source="tiny feynobg")


@pytest.fixture(scope="module")
def model():
    return tiny()


def _image(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _meta_state_dict(cls, size):
    with torch.device("meta"):
        return cls.build_network(size, 1).state_dict()


# ------------------------------------------------------------------------------------ declarations
def test_declarations_are_birefnets_but_the_backbone_name_and_capture_status():
    assert issubclass(FeyNobg, BiRefNet) and get_family("feynobg") is FeyNobg
    assert (FeyNobg.FAMILY, FeyNobg.TASK, FeyNobg.SIZES, FeyNobg.FILE_PREFIX) == ("feynobg", "matte", ("l",),
                                                                                  "LibreFeyNobg")
    # BiRefNet's preprocessing, input size, seam and inference stage, not copies of them
    assert FeyNobg.PREPROCESS is BiRefNet.PREPROCESS and FeyNobg.DEFAULT_IMGSZ == 1024 and FeyNobg.DEFAULT_NC == 1
    assert FeyNobg.PREDICT_SEAM and FeyNobg.infer_front is BiRefNet.infer_front
    # BiRefNet's predict seam, proven on a GPU at this depth (docs/families.md, "Matting"); no training
    assert FeyNobg.SUPPORTS_CUDA_GRAPH and FeyNobg.SUPPORTS_CUDA_GRAPH == BiRefNet.SUPPORTS_CUDA_GRAPH
    assert not (FeyNobg.SUPPORTS_CUDA_GRAPH_TRAIN or FeyNobg.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM)
    row = next(r for r in list_models() if r["family"] == "feynobg")
    assert row["task"] == "matte" and row["cuda_graph"] and row["cuda_graph_predict_seam"]
    # BiRefNet's own sizes are unchanged
    assert BiRefNet.SIZES == ("t", "l") and BiRefNet.CONFIGS["l"].depths == (2, 2, 18, 2)


def test_size_l_is_birefnet_l_with_six_more_stage_three_blocks_and_the_fixture_layout():
    """Counted on the meta device (nothing computed): the fixture's 262,779,906 parameters, its 838
    entries in checkpoint order, and exactly BiRefNet-l's keys plus blocks 18-23 of stage 3."""
    with torch.device("meta"):
        net = FeyNobg.build_network("l", 1)
    assert sum(p.numel() for p in net.parameters()) == 262_779_906
    fx = json.loads((FIXTURES_DIR / "feynobg-l.json").read_text())
    sd = net.state_dict()
    assert [(k, list(v.shape)) for k, v in sd.items()] == [(n, s) for n, s, _ in fx["layout"]]
    extra = set(sd) - set(_meta_state_dict(BiRefNet, "l"))
    assert extra and all(k.startswith(tuple(f"bb.layers.2.blocks.{j}." for j in range(18, 24))) for k in extra)
    assert len(fx["constants"]) == 30 and all(k.endswith("relative_position_index") for k in fx["constants"])
    assert swin_depths(sd) == (2, 2, 24, 2)


def test_checkpoints_are_told_apart_from_birefnets_by_their_stage_depths():
    feyno, bl, bt = (_meta_state_dict(FeyNobg, "l"), _meta_state_dict(BiRefNet, "l"),
                     _meta_state_dict(BiRefNet, "t"))
    for sd, fam, size in ((feyno, FeyNobg, "l"), (bl, BiRefNet, "l"), (bt, BiRefNet, "t")):
        cls, _, how = family_for_checkpoint({"model": sd}, "anonymous.pt")
        assert (cls, how) == (fam, "state-dict keys")
        assert cls.sniff_size(sd, 1) == size
    assert not BiRefNet.owns_state_dict(feyno) and not FeyNobg.owns_state_dict(bl)
    assert swin_depths({"bb.layers.1.blocks.3.norm1.weight": 0, "bb.norm0.weight": 0}) == (0, 4)
    # names: the registry's table alone
    assert parse_spec("LibreFeyNobgl.pt") == (FeyNobg, "l") and parse_spec("feynobg-l") == (FeyNobg, "l")
    assert parse_spec("feynobg-t") is None


# ------------------------------------------------------------------------------------ predict
def test_predict_gives_the_alpha_at_the_original_size(model, tmp_path):
    img = _image(50, 70, 0)
    r = model(img, imgsz=SIZE, color_format="rgb")
    a = r.alpha
    assert isinstance(a, Alpha) and a.shape == (50, 70) and r.boxes is None
    assert float(a.data.min()) >= 0.0 and float(a.data.max()) <= 1.0
    with torch.no_grad():
        logits = model.infer(model.preprocess(torch.from_numpy(img)[None], SIZE))
    ref = F.interpolate(logits.sigmoid(), size=(50, 70), mode="bilinear", align_corners=False)[0, 0]
    assert torch.equal(a.data, ref)
    png = np.asarray(Image.open(r.save(tmp_path / "cut.png")))
    assert png.shape == (50, 70, 4) and np.array_equal(png[..., :3], img)


def test_seam_halves_compose_to_the_whole_network(model):
    x = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model.infer_back(*model.infer_front(x)), model.infer(x))


def test_forced_seam_replays_the_encoder_and_runs_the_deformable_decoder_eager():
    """The capture this family would declare after its GPU run, driven through the stand-in
    capturer on this instance only: the same alpha, and the squeeze module never inside a replay."""
    img = _image(48, 64, 5)
    m = tiny()
    log: list[str] = []
    m.runner.supported = True
    m.runner.capturer = StandInCapturer(on_replay=log.append)
    m.model.squeeze_module.register_forward_pre_hook(lambda *a: log.append("deform"))
    eager = m(img, imgsz=SIZE).alpha.data
    log.clear()
    got = [m(img, imgsz=SIZE, cuda_graph=True).alpha.data for _ in range(3)]
    assert all(torch.equal(g, eager) for g in got)
    inside = [log[i + 1] == "deform" for i, e in enumerate(log) if e == "replay"]
    assert inside and not any(inside), log
    assert log.count("deform") == 3


def test_cli_predict_writes_the_cutout(model, monkeypatch, tmp_path):
    src = tmp_path / "in.png"
    Image.fromarray(_image(40, 56, 2)).save(src)
    assert cli._task_of("feynobg-l").name == "matte"        # the task is known from the name alone
    monkeypatch.setattr(cli, "_load", lambda opts, seed=None: model)
    out = tmp_path / "out"
    assert cli.main(["predict", "model=feynobg-l", f"source={src}", f"imgsz={SIZE}", f"save_dir={out}",
                     "verbose=false"]) == 0
    saved = list(out.rglob("*.png"))
    assert len(saved) == 1 and Image.open(saved[0]).mode == "RGBA"


# ------------------------------------------------------------------------------------ refusals
def test_no_training_no_validation_and_clear_errors(model, tmp_path):
    # ONNX: the matte task exports through BiRefNet's graph (tests/unit/test_export_task_graphs.py)
    with pytest.raises(NotImplementedError, match="matte task"):
        model.train(data="shapes", epochs=1)
    with pytest.raises(NotImplementedError, match="matte task"):
        model.val(data="shapes")
    with pytest.raises(ValueError, match="FeyNobg predicts one alpha matte"):
        FeyNobg.build_network("l", 2)
    with pytest.raises(ValueError, match="unknown size 't' for feynobg"):
        LibreYOLO.new("feynobg", "t", device="cpu")
    with pytest.raises(ValueError, match="unknown FeyNobg size"):
        FeyNobg.build_network("t", 1)
