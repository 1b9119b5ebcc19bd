"""The tokenizers of the image-text families (libreyolo.text) against reference tokenizations."""
import pytest
import torch
from conftest import FIXTURES_DIR

from libreyolo.text import ClipTokenizer, GemmaTokenizer, TokenizerUnavailable, vocab_path

PROMPTS = ["a photo of a cat", "a diagram of a neural network"]

#: OpenAI CLIP's SimpleTokenizer (open_clip 3.3.0's copy, ftfy a no-op on these) on harder text:
#: HTML entities, accents, CJK, digits, contractions, punctuation runs
CLIP_REFERENCE = {
    "It's 2024!! Héllo   wörld &amp; <b>tag</b>": [49406, 585, 568, 273, 271, 273, 275, 748, 71, 3459, 19293, 86,
                                                     31762, 730, 261, 283, 321, 285, 3640, 34308, 321, 285, 49407],
    "naïve café — 東京 tower, 3.14159": [49406, 1097, 35689, 563, 15304, 2005, 48338, 21078, 361, 4730, 267, 274, 269,
                                         272, 275, 272, 276, 280, 49407],
    "don't they've we'll I'd": [49406, 847, 713, 889, 1200, 649, 1342, 328, 1896, 49407],
}


def fixture_ids(name):
    return torch.load(FIXTURES_DIR / f"{name}.pt", weights_only=True)["extra_inputs"]["input_ids"]


def test_clip_tokenizer_reproduces_the_fixture_ids():
    assert torch.equal(ClipTokenizer()(PROMPTS), fixture_ids("clip-b32"))


@pytest.mark.parametrize("text", sorted(CLIP_REFERENCE))
def test_clip_tokenizer_matches_openai_tokenizer(text):
    ids = ClipTokenizer()([text])[0]
    n = len(CLIP_REFERENCE[text])
    assert ids[:n].tolist() == CLIP_REFERENCE[text]
    assert not ids[n:].any()


def test_clip_tokenizer_truncates_and_keeps_end_of_text():
    ids = ClipTokenizer()(["x " * 200, ""])
    assert ids.shape == (2, 77) and ids[0, 0] == 49406 and ids[0, -1] == 49407
    assert ids[1, :2].tolist() == [49406, 49407] and not ids[1, 2:].any()


def test_gemma_tokenizer_reproduces_the_fixture_ids():
    tok = GemmaTokenizer()
    assert tok.vocab_size == 256000
    assert torch.equal(tok(PROMPTS), fixture_ids("siglip2-b16"))
    assert torch.equal(tok(["A Photo Of A Cat"]), tok(["a photo of a cat"]))   # lower-cased


def test_gemma_tokenizer_truncates_and_keeps_end_of_sequence():
    ids = GemmaTokenizer()(["cat " * 100])
    assert ids.shape == (1, 64) and ids[0, -1] == 1 and (ids[0, :-1] != 0).all()


def test_bad_texts_are_refused():
    with pytest.raises(TypeError, match="string or a sequence of strings"):
        ClipTokenizer()([1, 2])
    with pytest.raises(TypeError, match="string or a sequence of strings"):
        GemmaTokenizer()(None)


def test_vocab_files_ship_and_a_missing_library_is_named(monkeypatch):
    assert vocab_path("bpe_simple_vocab_16e6.txt.gz").stat().st_size > 1_000_000
    assert vocab_path("gemma_tokenizer.model.gz").stat().st_size > 1_000_000
    import sys

    from libreyolo.text import tokenizers as tk
    monkeypatch.setitem(sys.modules, "sentencepiece", None)   # import sentencepiece -> ImportError
    tk._gemma_backend.cache_clear()
    try:
        with pytest.raises(TokenizerUnavailable, match=r"libreyolo-graphs\[text\]"):
            GemmaTokenizer()
    finally:
        tk._gemma_backend.cache_clear()
