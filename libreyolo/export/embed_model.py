"""``LibreYOLO("clip.onnx")``: an image-text export (CLIP, SigLIP 2) behind the PyTorch model's API.

The export (:mod:`libreyolo.tasks.embed.export`) is two graphs: ``x.onnx``, the image tower
(``images`` (B, 3, S, S) in [0, 1], the family's resize done -> ``embedding`` (B, D), normalized),
and ``x-text.onnx`` beside it (its ``parts`` metadata names it), the text tower (``input_ids``
(T, L) int64 -> ``text_embedding`` (T, D), normalized). :class:`OnnxImageTextModel` runs both in
onnxruntime sessions and keeps the rest as the PyTorch model does it:

* images are resized exactly as eager predict resizes them (:class:`~.onnx_model.OnnxModel`);
* text is tokenized on the host with the shipped tokenizer (``libreyolo.text``, the family's, at
  the shortest of its bucketed lengths that holds the prompts) and encoded by the text graph;
* ``set_classes(prompts, template=)`` caches the normalized prompt rows; predict of a classify
  export computes ``logit_scale * embedding @ head.T (+ logit_bias)`` and then the classify task's
  own stage end (softmax or a sigmoid per prompt, top-k) and Results (``Results.probs``); of an
  embed export, ``Results.embedding`` through the embed task's plan;
* ``embed(images)``, ``embed_text(texts)``, ``embedder()``, ``tokenize``, ``prompts()``,
  ``class_head()`` and ``logits`` answer as the PyTorch model's do.

A classify model's prompts travel in the metadata (``prompts``): the loaded model starts with the
classes it was exported with. Training, CUDA graphs and export need the checkpoint.
"""
from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .onnx_model import OnnxModel, Ready


class OnnxImageTextModel(OnnxModel):
    """A CLIP / SigLIP 2 export (``x.onnx`` + ``x-text.onnx``) with the PyTorch model's predict,
    ``set_classes``, ``embed`` and ``embed_text`` (see the module docstring)."""

    #: prompts per text-graph run (as the PyTorch model's ``TEXT_CHUNK``)
    TEXT_CHUNK = 64

    def __init__(self, path: str | os.PathLike, device: Any = "auto", *, threads: int | None = None):
        super().__init__(path, device, threads=threads)
        meta = self.meta
        self.logit_scale = float(meta["logit_scale"])
        self.logit_bias = float(meta["logit_bias"])
        self.PROBS = meta["probs"]
        self.TOKENIZER = meta["tokenizer"]
        self.context_length = int(meta["context_length"])
        self.TEXT_BUCKETS = tuple(int(b) for b in json.loads(meta["text_buckets"]))
        from ..tasks.classify.task import ClassifyTask
        self.topk = int(ClassifyTask.predict_defaults["topk"])   # not in the graph: the head runs here
        saved = json.loads(meta.get("prompts", "null"))
        self._prompts = None if saved is None else (tuple(saved[0]), saved[1])
        self._tokenizer = None
        self._heads: dict = {}

    def to(self, device: Any) -> OnnxImageTextModel:
        super().to(device)
        self.text_session, self.text_path = self._open_text_graph()
        return self

    def _open_text_graph(self):
        """The text graph's session, on the image graph's providers; its file is checked to be the
        text part the image graph names (same family, size, task)."""
        from .onnx import read_metadata
        parts = json.loads(self.meta.get("parts") or "{}")
        p = self.path.with_name(parts["text"])
        if not p.is_file():
            raise FileNotFoundError(f"{self.path.name} needs its text graph {p.name} beside it ({str(p)!r} not "
                                    "found); copy both files, or export again")
        meta = read_metadata(p)
        if (meta.get("part"), meta.get("family"), meta.get("size"), meta.get("task")) != \
                ("text", self.FAMILY, self.size, self.meta["task"]):
            raise ValueError(f"{p} is not the text graph of {self.path.name} (its metadata: family "
                             f"{meta.get('family')!r}, size {meta.get('size')!r}, task {meta.get('task')!r}, part "
                             f"{meta.get('part')!r}); export again")
        return self._session(p), p

    # ------------------------------------------------------------------ text
    @property
    def tokenizer(self):
        """The family's tokenizer (``libreyolo.text``; its package is the ``text`` extra)."""
        if self._tokenizer is None:
            from .. import text
            self._tokenizer = getattr(text, self.TOKENIZER)(context_length=self.context_length)
        return self._tokenizer

    def tokenize(self, texts: str | Sequence[str]) -> torch.Tensor:
        """Texts -> (T, L) int64 token ids at the shortest of ``TEXT_BUCKETS`` that holds them all."""
        from ..models.clip.family import ImageTextModel
        return ImageTextModel.tokenize(self, texts)   # type: ignore[arg-type]

    def encode_text_ids(self, input_ids: torch.Tensor, net: Any = None, cuda_graph: Any = False) -> torch.Tensor:
        """(T, L) token ids -> (T, D) L2-normalized float32 text embeddings, by the text graph."""
        if net is not None:
            self._no("encode_text_ids(net=...) (another network)")
        self._check_graph_mode(cuda_graph)
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
            raise TypeError("input_ids must be a (T, L) int64 tensor of token ids")
        ids = input_ids.cpu().numpy()
        rows = [self.text_session.run(None, {"input_ids": ids[i:i + self.TEXT_CHUNK]})[0]
                for i in range(0, len(ids), self.TEXT_CHUNK)]
        if not rows:
            return torch.zeros(0, int(self.text_session.get_outputs()[0].shape[1]))
        return torch.from_numpy(np.concatenate(rows))

    def embed_text(self, texts: str | Sequence[str], cuda_graph: Any = False) -> torch.Tensor:
        """Texts -> (T, D) L2-normalized text embeddings (float32, CPU), in the space of :meth:`embed`."""
        return self.encode_text_ids(self.tokenize(texts), cuda_graph=cuda_graph)

    def _check_graph_mode(self, cuda_graph: Any) -> None:
        from ..graphs.runner import normalize_mode
        if normalize_mode(cuda_graph) is True:
            raise NotImplementedError(f"cuda_graph=True needs the PyTorch engine; {self.path.name} is an {self.KIND} "
                                      f"model run by {self.BACKEND} (use cuda_graph=False, or the .pt checkpoint)")

    # ------------------------------------------------------------------ classes as prompts
    def set_classes(self, prompts: Sequence[str], template: str | None = None,
                    cuda_graph: Any = None) -> OnnxImageTextModel:
        """Make ``prompts`` the classes (as the PyTorch model's ``set_classes``): predict gives
        ``Results.probs`` over them; their text rows are computed now, once, and cached."""
        from ..models.clip.family import check_prompts
        self._check_graph_mode(cuda_graph)
        items = check_prompts(prompts, template)
        self._prompts = (items, template)
        self.nc = len(items)
        self.names = dict(enumerate(items))
        self.class_head()
        return self

    def prompts(self) -> list[str]:
        """The texts the classes are encoded from (prompts, or the names in ``"a photo of a {}."``)."""
        from ..models.clip.family import ImageTextModel
        return ImageTextModel.prompts(self)   # type: ignore[arg-type]

    def class_head(self, net: Any = None, cuda_graph: Any = None) -> torch.Tensor:
        """(nc, D) normalized text rows of the classes, cached until the prompts change."""
        texts = tuple(self.prompts())
        head = self._heads.get(texts)
        if head is None:
            head = self.encode_text_ids(self.tokenize(list(texts)), net, cuda_graph=False)
            self._heads = {texts: head}
        return head

    def logits(self, image_emb: torch.Tensor, text_emb: torch.Tensor, net: Any = None) -> torch.Tensor:
        """Normalized image (B, D) and text (K, D) rows -> (B, K) logits (the exported scale and bias)."""
        out = torch.tensor(self.logit_scale, dtype=torch.float32) * image_emb @ text_emb.T
        if self.PROBS == "sigmoid":   # SigLIP's bias (CLIP has none: adding its 0.0 would change nothing)
            out = out + torch.tensor(self.logit_bias, dtype=torch.float32)
        return out

    # ------------------------------------------------------------------ images
    def embedder(self) -> OnnxImageTextModel:
        """This model under the ``embed`` task (the same sessions): predict gives ``Results.embedding``."""
        if self.TASK == "embed":
            return self
        twin = copy.copy(self)
        twin.TASK = "embed"
        return twin

    def embed(self, images: Any, **kwargs: Any) -> torch.Tensor:
        """Images (anything predict takes) -> (N, D) L2-normalized image embeddings (float32, CPU)."""
        from ..models.clip.family import ImageTextModel
        return ImageTextModel.embed(self, images, **kwargs)   # type: ignore[arg-type]

    @property
    def model(self):
        """What ``embed`` reads for an empty source's width: the embedding size."""
        return _Dims(int(self.session.get_outputs()[0].shape[1]))

    def predict(self, source: Any, *, imgsz: int | None = None, **kwargs: Any) -> Any:
        """As the PyTorch model's predict (classify: ``Results.probs`` over the classes; embed:
        ``Results.embedding``), through the two graphs; ``imgsz`` must be the towers' size."""
        if imgsz is not None and imgsz != self.imgsz:
            raise ValueError(f"{self.FAMILY}-{self.size} takes {self.imgsz}x{self.imgsz} images only (its position "
                             f"embedding is not interpolated), got imgsz={imgsz}")
        return super().predict(source, **kwargs)

    __call__ = predict

    def _task_feeds(self, plan, task_opts: dict) -> dict[str, np.ndarray]:
        return {}   # the graph takes the images alone: top-k and the head run on the host

    def _results(self, plan, out: dict[str, np.ndarray], chunk, size: int, speed: dict) -> list:
        emb = torch.from_numpy(np.ascontiguousarray(out["embedding"][:len(chunk)]))
        if self.TASK == "embed":
            return plan.results(Ready(emb), chunk, size, speed)
        return plan.results(Ready(plan.finish(self.logits(emb, self.class_head()))), chunk, size, speed)


class _Dims:
    """The embedding width under the name the PyTorch network gives it (``embed_dim``)."""

    def __init__(self, embed_dim: int):
        self.embed_dim = embed_dim
