"""CLIP and SigLIP 2: the text tower as a stage of its own, run by the model's text graph runner.

On the CPU the stage must equal the eager tower; the runner's policy (one graph per bucketed
length, the chunk filled up to ``TEXT_CHUNK`` rows where graphs can run, graphs kept across
``set_classes``) is driven with the stand-in capturer (tests/standin.py), as the other graph
policy tests do. The GPU proof is docs/families.md's command ("CLIP and SigLIP 2").
"""
import pytest
import torch
import torch.nn.functional as F
from standin import StandInCapturer
from test_embed import FAMILIES, tiny, tiny_sizes  # noqa: F401  (tiny_sizes: the module's autouse fixture)

from libreyolo import SAMPLE_IMAGE
from libreyolo.graphs.runner import GraphUnavailableError

PROMPTS = ["a red circle", "a small blue triangle", "a photo of a dog"]
LONG = "a very long prompt " * 5   # more than 16 tokens: CLIP's 32-token bucket


def eager_tower(m, ids):
    with torch.no_grad():
        return F.normalize(m.model.encode_text(ids).float(), dim=-1)


@pytest.mark.parametrize("family", FAMILIES)
def test_text_stage_equals_the_eager_tower(family):
    m = tiny(family)
    ids = m.tokenize(PROMPTS)
    assert torch.equal(m.embed_text(PROMPTS), eager_tower(m, ids))
    m.set_classes(PROMPTS)
    assert torch.equal(m.class_head(), eager_tower(m, ids))
    info = m.graph_info()
    assert info["text"]["eager_calls"] >= 2 and info["graphs"] == []   # the CPU: eager, no graph
    assert torch.equal(m.embed_text(PROMPTS, cuda_graph="auto"), m.embed_text(PROMPTS))   # auto: eager here
    with pytest.raises(GraphUnavailableError):   # declared capturable, but the CPU has no CUDA graph
        m.embed_text(PROMPTS, cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph must be"):
        m.set_classes(PROMPTS, cuda_graph="sometimes")


@pytest.mark.parametrize("family", FAMILIES)
def test_text_stage_is_one_graph_per_bucketed_length(family):
    m = tiny(family)
    cap = m.text_runner.capturer = StandInCapturer()
    m.text_runner.supported = True
    ref = m.embed_text(PROMPTS)                              # eager (cuda_graph=False), filled up too
    got = m.embed_text(PROMPTS, cuda_graph=True)             # capture
    assert cap.captures == [((m.TEXT_CHUNK, m.TEXT_BUCKETS[0]),)]
    assert torch.equal(got, ref)
    assert torch.allclose(ref, eager_tower(m, m.tokenize(PROMPTS)), atol=1e-6)   # the zero rows change nothing
    two = m.embed_text(PROMPTS[:2], cuda_graph=True)        # another row count, same bucket: a replay
    assert len(cap.captures) == 1 and torch.equal(two, ref[:2])
    m.set_classes(PROMPTS[::-1], cuda_graph=True)            # releases the image stage, keeps the text graph
    assert len(cap.captures) == 1 and torch.equal(m.class_head(), ref.flip(0))
    long = m.embed_text([LONG], cuda_graph=True)
    if family == "clip":   # the 32-token bucket: its own graph
        assert cap.captures[1] == ((m.TEXT_CHUNK, 32),)
    else:                  # SigLIP 2 runs every prompt at 64
        assert len(cap.captures) == 1
    assert torch.allclose(long, eager_tower(m, m.tokenize([LONG])), atol=1e-6)
    info = m.graph_info()
    assert [g["stage"] for g in info["graphs"]] == [repr(m.text_key(b)) for b in m.TEXT_BUCKETS[:len(cap.captures)]]
    assert info["replays"] >= 3 and m.release_graphs() == len(cap.captures)


def test_predict_encodes_the_class_head_under_its_cuda_graph_mode():
    m = tiny("clip")
    m.set_classes(["a bird"])   # not the 1000 default names: their 16 chunks would repeat a signature
    cap = m.text_runner.capturer = StandInCapturer()
    m.text_runner.supported = True
    r = m(SAMPLE_IMAGE, prompts="a cat,a dog", cuda_graph="auto")   # auto: the image stage eager on the CPU
    assert len(r.probs) == 2 and cap.captures == []                 # auto captures once a signature repeats
    m(SAMPLE_IMAGE, prompts="a dog,a cat", cuda_graph="auto")
    assert cap.captures == [((m.TEXT_CHUNK, 16),)]
    assert m._text_mode is False                                     # set for the call only


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_cases_cover_each_bucket(family):
    m = tiny(family)
    cases = m.verify_cases(32, 8, (48, 64))
    assert [c[0] for c in cases] == [f"text-stage L{b} rows{m.TEXT_CHUNK}" for b in m.TEXT_BUCKETS]
    name, fn, (a,), (b,) = cases[-1]
    assert a.shape == b.shape == (m.TEXT_CHUNK, m.TEXT_BUCKETS[-1]) and a.dtype == torch.long
    with torch.no_grad():
        out_a, out_b = fn(a), fn(b)
    assert torch.equal(out_a, eager_tower(m, a)) and not torch.equal(out_a, out_b)
