"""The Hugging Face hub both ways, against a hub stand-in on 127.0.0.1 (tests/hub_standin.py):
``model.push_to_hub`` (repo created, safetensors weights and a model card in one commit),
``LibreYOLO("owner/repo")`` and ``hf://owner/repo@rev/file`` (any repo: the checkpoint's
metadata decides the family), revisions, the cache with downloads off, and the errors."""
from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path

import pytest
import torch
from hub_standin import StandInHub, point_hub_at

from libreyolo import LibreYOLO
from libreyolo import weights as W
from libreyolo.hub import HUB_FILE, HubRef, parse_hub_ref


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with StandInHub(token="secret") as server:
        point_hub_at(monkeypatch, tmp_path, server.url)
        yield server
        point_hub_at(monkeypatch, tmp_path, server.url)   # drops the pooled connections


def small_model(seed: int = 0):
    return LibreYOLO.new("yolox", "n", nc=3, names=["cat", "dog", "bird"], imgsz=64, device="cpu", seed=seed)


def same_weights(a, b) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("text, ref", [
    ("owner/repo", HubRef("owner/repo")),
    ("owner/repo@v1", HubRef("owner/repo", "v1")),
    ("hf://owner/repo", HubRef("owner/repo")),
    ("hf://owner/my.repo@0123abc/sub/best.pt", HubRef("owner/my.repo", "0123abc", "sub/best.pt")),
    ("hf://owner/repo/model.safetensors", HubRef("owner/repo", None, "model.safetensors")),
    ("yolo9t", None), ("LibreYOLO9t.pt", None), ("runs/best.pt", None), ("a/b/c", None), ("dir/model.onnx", None),
])
def test_parse_hub_ref(text, ref):
    assert parse_hub_ref(text) == ref


def test_bad_hf_url_names_the_form():
    with pytest.raises(ValueError, match="the form is hf://owner/repo"):
        parse_hub_ref("hf://just-a-name")


def test_push_then_load_by_repo_and_by_revision(hub, tmp_path):
    first = small_model(seed=0)
    first.meta["train_metrics"] = {"map50": 0.5, "map50_95": 0.25, "per_class": {0: 0.1}}
    info = first.push_to_hub("me/shapes", token="secret")
    repo = hub.repos["me/shapes"]
    assert info.oid == repo.sha("main") and set(repo.files("main")) == {HUB_FILE, "README.md"}

    loaded = LibreYOLO("me/shapes", device="cpu")
    assert type(loaded) is type(first) and loaded.size == "n" and loaded.nc == 3
    assert loaded.names == {0: "cat", 1: "dog", 2: "bird"} and loaded.imgsz == 64
    assert same_weights(loaded, first)
    assert loaded.preprocess.as_dict() == first.preprocess.as_dict()
    assert loaded.meta["train_metrics"]["map50_95"] == 0.25

    # the card: hub metadata, the metrics, the exact preprocess record
    card = repo.files("main")["README.md"].decode()
    assert card.startswith("---\nlibrary_name: libreyolo\n") and "pipeline_tag: object-detection" in card
    assert "| map50_95 | 0.25 |" in card and "| per_class/0 | 0.1 |" in card
    record = json.loads(card.split("```json\n", 1)[1].split("```", 1)[0])
    assert record == first.preprocess.as_dict()
    assert 'LibreYOLO("me/shapes")' in card and "0: cat, 1: dog, 2: bird" in card

    # a second push is a second commit; the first stays loadable by its commit id
    second = small_model(seed=1)
    second.push_to_hub("me/shapes", token="secret")
    assert len(repo.commits) == 2
    latest = LibreYOLO("hf://me/shapes", device="cpu")
    old = LibreYOLO(f"hf://me/shapes@{info.oid}/{HUB_FILE}", device="cpu")
    assert same_weights(latest, second) and same_weights(old, first) and not same_weights(latest, old)
    assert LibreYOLO(f"me/shapes@{info.oid}", device="cpu").model.state_dict().keys() == old.model.state_dict().keys()


def test_any_repo_the_checkpoint_metadata_decides_the_family(hub, tmp_path):
    """A .pt under any name in a repo of someone else's: loaded safely, built as its metadata says."""
    model = LibreYOLO.new("yolo9", "t", nc=2, names=["a", "b"], device="cpu", seed=0)
    path = model.save(tmp_path / "whatever-name.pt")
    hub.repos["someone/detector"] = repo = __import__("hub_standin").Repo()
    repo.commit("main", {"weights/whatever-name.pt": path.read_bytes(), "notes.txt": b"hello"})
    got = LibreYOLO("someone/detector", device="cpu")
    assert got.FAMILY == "yolo9" and got.size == "t" and got.names == {0: "a", 1: "b"} and same_weights(got, model)
    assert LibreYOLO("hf://someone/detector/weights/whatever-name.pt", device="cpu", nc=2).FAMILY == "yolo9"


def test_a_pickle_on_the_hub_is_refused_not_run(hub, tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, (f"open({str(tmp_path / 'pwned')!r}, 'w').write('ran')",))

    buf = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(1)}, "extra": Boom()}, buf)
    hub.repos["evil/repo"] = repo = __import__("hub_standin").Repo()
    repo.commit("main", {"model.pt": buf.getvalue()})
    with pytest.raises(ValueError, match="not allowed"):
        LibreYOLO("evil/repo", device="cpu")
    assert not (tmp_path / "pwned").exists()


def test_downloads_off_reads_the_cache_and_says_when_it_is_not_there(hub, monkeypatch):
    small_model().push_to_hub("me/cached", token="secret")
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"hf://me/cached: it is not in the hub cache, and downloads are "
                                                r"disabled by LIBREYOLO_OFFLINE=1"):
        LibreYOLO("me/cached", device="cpu")
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "0")
    online = LibreYOLO("me/cached", device="cpu")
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "1")
    count = len(hub.requests)
    offline = LibreYOLO("me/cached", device="cpu")
    assert same_weights(online, offline) and len(hub.requests) == count   # no request


@pytest.mark.parametrize("text, message", [
    ("nobody/nothing", r"hf://nobody/nothing: hub repo 'nobody/nothing' \(http://127.0.0.1:\d+\) does not exist, "
                       r"or is private or gated"),
    ("hf://me/repo@v9", r"hub repo 'me/repo' at revision 'v9' \(.*\): there is no revision 'v9'"),
    ("hf://me/repo/missing.pt", r"hub repo 'me/repo' \(.*\) has no file 'missing.pt'"),
    ("me/empty", r"holds no checkpoint \(.safetensors, .pt, .pth\); its files: notes.txt"),
    ("me/two", r"holds several checkpoints \(a.pt, b.pt\); name one: LibreYOLO\('hf://me/two/a.pt'\)"),
])
def test_hub_errors_are_one_clear_error(hub, text, message):
    from hub_standin import Repo
    for name, files in (("me/repo", {"x.pt": b"x"}), ("me/empty", {"notes.txt": b""}),
                        ("me/two", {"a.pt": b"a", "b.pt": b"b"})):
        hub.repos[name] = Repo()
        hub.repos[name].commit("main", files)
    with pytest.raises(FileNotFoundError, match=message):
        LibreYOLO(text, device="cpu")


def test_push_without_a_token_is_refused_with_what_to_do(hub):
    with pytest.raises(OSError, match=r"push_to_hub\('me/x'\) to http://127.0.0.1:\d+ failed: HTTP 401 "
                                      r"\(a write token is needed: pass token=, set HF_TOKEN"):
        small_model().push_to_hub("me/x")
    with pytest.raises(ValueError, match="push_to_hub needs a repo id 'owner/name', got 'no-owner'"):
        small_model().push_to_hub("no-owner")


def test_existing_repo_with_exist_ok_false(hub):
    small_model().push_to_hub("me/once", token="secret")
    with pytest.raises(OSError, match="HTTP 409"):
        small_model().push_to_hub("me/once", token="secret", exist_ok=False)


def test_unreachable_hub_fails_fast(monkeypatch, tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    point_hub_at(monkeypatch, tmp_path, f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"cannot load hf://me/model: the hub \(127.0.0.1:\d+\) could not be "
                                                r"reached within 2 s .*set LIBREYOLO_OFFLINE=1"):
        LibreYOLO("me/model", device="cpu")
    assert time.monotonic() - start < 4


def test_trained_model_pushes_its_best_metrics(hub, tmp_path):
    """After train(), the model holds best.pt's weights; the card shows that epoch's metrics."""
    from libreyolo.data.synthetic import make_shapes_dataset
    data = make_shapes_dataset(tmp_path / "ds", n_train=8, n_val=4, imgsz=64, seed=0)
    model = LibreYOLO.new("yolox", "n", nc=5, device="cpu", seed=0)
    res = model.train(data=str(data), epochs=1, batch=8, imgsz=64, workers=0, project=str(tmp_path), name="run",
                      warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, seed=0)
    model.push_to_hub("me/trained", token="secret")
    best = W.load_checkpoint(res["best"])
    card = hub.repos["me/trained"].files("main")["README.md"].decode()
    assert f"| map50_95 | {best['train_metrics']['map50_95']:.6g} |" in card
    back = LibreYOLO("me/trained", device="cpu")
    assert all(torch.equal(back.model.state_dict()[k], v) for k, v in best["model"].items())
    assert Path(res["best"]).is_file()
