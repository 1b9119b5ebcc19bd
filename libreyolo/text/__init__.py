"""Text tokenizers of the image-text families (CLIP, SigLIP 2) and the vocabularies they read.

The vocabularies ship with the package (``libreyolo/text/vocab``; sources and licences in its
``NOTICE.md``). The tokenizers run on well-kept libraries, installed by the ``text`` extra
(``pip install libreyolo-graphs[text]``): CLIP's byte-level BPE on Hugging Face ``tokenizers``,
SigLIP 2's Gemma SentencePiece model on ``sentencepiece``. Without them the towers still run on
token ids (``encode_text``); turning text into ids raises :class:`TokenizerUnavailable` naming
the missing package.
"""
from __future__ import annotations

from .tokenizers import ClipTokenizer, GemmaTokenizer, TokenizerUnavailable, vocab_path

__all__ = ["ClipTokenizer", "GemmaTokenizer", "TokenizerUnavailable", "vocab_path"]
