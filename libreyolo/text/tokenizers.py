"""CLIP's BPE tokenizer and SigLIP 2's Gemma SentencePiece tokenizer (see the package docstring).

Both return a (T, L) int64 tensor of token ids, zero padded, as the checkpoints were trained on:

* :class:`ClipTokenizer`: OpenAI CLIP's ``SimpleTokenizer`` - text HTML-unescaped, whitespace
  collapsed, lower-cased; words split by CLIP's pattern (contractions, letter runs, single
  digits, other symbol runs), each word's UTF-8 bytes merged by the 48,894 BPE merges of
  ``bpe_simple_vocab_16e6`` with ``</w>`` ending a word; ``<|startoftext|>`` (49406) first,
  ``<|endoftext|>`` (49407) last, context 77 (a longer prompt is cut and still ends with
  end-of-text). The merges run in Hugging Face ``tokenizers`` (its BPE model with CLIP's
  normalizer and pre-tokenizer, as transformers' ``CLIPTokenizerFast`` builds it). One
  difference from OpenAI's tokenizer: no ``ftfy.fix_text`` (mojibake repair) runs first.
* :class:`GemmaTokenizer`: SigLIP 2's text pre-processing - lower-cased, the Gemma SentencePiece
  model (no beginning-of-sequence token, no dummy prefix), end-of-sequence (1) appended, padded
  with 0 (pad) to the context of 64; a longer prompt keeps its first 63 pieces and the
  end-of-sequence token.
"""
from __future__ import annotations

import functools
import gzip
import html
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import torch

CLIP_VOCAB = "bpe_simple_vocab_16e6.txt.gz"
GEMMA_VOCAB = "gemma_tokenizer.model.gz"


class TokenizerUnavailable(ImportError):
    """A tokenizer's library is not installed (the ``text`` extra)."""


def vocab_path(name: str) -> Path:
    """The shipped vocabulary file ``name`` (``libreyolo/text/vocab``)."""
    path = Path(str(resources.files(__package__) / "vocab" / name))
    if not path.is_file():
        raise FileNotFoundError(f"the vocabulary file {path} is missing from this libreyolo installation "
                                "(package data: reinstall the package)")
    return path


def _require(module: str, what: str):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TokenizerUnavailable(
            f"{what} needs the '{module}' package, which is not installed: pip install "
            f"'libreyolo-graphs[text]' (or pip install {module}). The towers still take token ids: "
            "model.model.encode_text(input_ids).") from None


def _texts(texts: str | Sequence[str]) -> list[str]:
    items = [texts] if isinstance(texts, str) else list(texts) if isinstance(texts, Sequence) else None
    if items is None or not all(isinstance(t, str) for t in items):
        raise TypeError(f"texts must be a string or a sequence of strings, got {type(texts).__name__}"
                        + ("" if items is None else f" holding {sorted({type(t).__name__ for t in items})}"))
    return items


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / CLIP's reversible byte -> printable character table (the BPE works on these)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class ClipTokenizer:
    """CLIP's tokenizer (see the module docstring); ``tokenizer(texts)`` -> (T, context) ids."""

    sot_id = 49406
    eot_id = 49407
    #: CLIP's word pattern (OpenAI's SimpleTokenizer), the special tokens left out: prompts are text
    PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""

    def __init__(self, context_length: int = 77):
        self.context_length = int(context_length)
        self._tok = _clip_backend()

    def encode(self, text: str) -> list[int]:
        """One text -> its BPE ids (no start / end tokens)."""
        return self._tok.encode(html.unescape(html.unescape(text)), add_special_tokens=False).ids

    def __call__(self, texts: str | Sequence[str], context_length: int | None = None) -> torch.Tensor:
        n = int(context_length or self.context_length)
        items = _texts(texts)
        out = torch.zeros(len(items), n, dtype=torch.long)
        for i, text in enumerate(items):
            ids = [self.sot_id, *self.encode(text)[:n - 2], self.eot_id]
            out[i, :len(ids)] = torch.tensor(ids)
        return out

    @property
    def vocab_size(self) -> int:
        return 49408


@functools.lru_cache(maxsize=1)
def _clip_backend():
    """A ``tokenizers`` BPE model built from the shipped merges, as CLIP's SimpleTokenizer builds
    its vocabulary: the 256 byte characters, the same with ``</w>``, one entry per merge, then
    the two special tokens (ids 49406, 49407)."""
    tk = _require("tokenizers", "CLIP's tokenizer")
    lines = gzip.open(vocab_path(CLIP_VOCAB)).read().decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1:49152 - 256 - 2 + 1]]
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    ids = {t: i for i, t in enumerate(vocab)}
    tok = tk.Tokenizer(tk.models.BPE(vocab=ids, merges=merges, end_of_word_suffix="</w>",
                                     continuing_subword_prefix="", unk_token="<|endoftext|>", fuse_unk=False))
    tok.normalizer = tk.normalizers.Sequence([tk.normalizers.NFC(),
                                              tk.normalizers.Replace(tk.Regex(r"\s+"), " "),
                                              tk.normalizers.Lowercase()])
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(ClipTokenizer.PATTERN), behavior="removed", invert=True),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


class GemmaTokenizer:
    """SigLIP 2's tokenizer (see the module docstring); ``tokenizer(texts)`` -> (T, 64) ids."""

    pad_id = 0
    eos_id = 1

    def __init__(self, context_length: int = 64):
        self.context_length = int(context_length)
        self._sp = _gemma_backend()

    def encode(self, text: str) -> list[int]:
        """One text -> its SentencePiece ids, lower-cased (no end-of-sequence token)."""
        return self._sp.encode(text.lower())

    def __call__(self, texts: str | Sequence[str]) -> torch.Tensor:
        n = self.context_length
        items = _texts(texts)
        out = torch.full((len(items), n), self.pad_id, dtype=torch.long)
        for i, text in enumerate(items):
            ids = [*self.encode(text)[:n - 1], self.eos_id]
            out[i, :len(ids)] = torch.tensor(ids)
        return out

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())


@functools.lru_cache(maxsize=1)
def _gemma_backend():
    spm = _require("sentencepiece", "SigLIP 2's tokenizer")
    return spm.SentencePieceProcessor(model_proto=gzip.open(vocab_path(GEMMA_VOCAB)).read())
