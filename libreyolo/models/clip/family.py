"""What CLIP and SigLIP 2 share: two towers, a tokenizer, zero-shot classification and embeddings.

:class:`ImageTextModel` is the zero-shot classifier (task ``classify``, the task the LibreYOLO
checkpoints of both families carry). Its classes are text prompts: :meth:`set_classes` encodes
them with the text tower once and caches the L2-normalized rows; :meth:`infer` is the image
tower, normalized, against that cached head - CLIP: ``logit_scale.exp() * cos`` (the classify
task's softmax makes the probabilities), SigLIP 2: ``logit_scale.exp() * cos + logit_bias`` with
a sigmoid per prompt (``PROBS = "sigmoid"``: each prompt's probability on its own, as SigLIP
was trained). Without :meth:`set_classes` the head is the model's class names in the template
``"a photo of a {}."`` (a checkpoint's 1000 ImageNet names), encoded at the first predict.

:class:`ImageTextEmbedder` is the same network under the ``embed`` task: predict gives
``Results.embedding`` (the normalized image embedding), and it trains contrastively on image /
caption pairs (:mod:`libreyolo.tasks.embed`): CLIP's symmetric cross-entropy over the batch,
SigLIP's pairwise sigmoid loss.

Text runs outside predict's image stage, as a stage of its own (:meth:`text_stage`: the text
tower and the L2 normalization) through the model's text graph runner (``text_runner``, a
:class:`~libreyolo.graphs.runner.GraphRunner` of the same network: ``set_classes`` releases the
image stage's graphs, which read the cached head, without dropping the text graphs). Prompts run
at a bucketed token length (``TEXT_BUCKETS``: CLIP 16 / 32 / 77 - its causal tower pools the
end-of-text token, so the padding after it changes nothing -, SigLIP 2 its full 64, whose tower
sees the padding), ``TEXT_CHUNK`` rows at a time; where graphs can run (a CUDA device) a last,
shorter chunk is filled up with rows of zeros (eager too: ``cuda_graph`` changes how, not what),
so each bucketed length is one shape - one captured graph. ``cuda_graph`` of :meth:`set_classes`
/ :meth:`embed_text` (and of predict, for the class head it encodes) picks the mode. No CUDA-graph
declaration yet (``SUPPORTS_CUDA_GRAPH`` False): the GPU command that would prove both stages is
in docs/families.md; :meth:`verify_cases` gives ``libreyolo verify`` the text stage's cases.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...graphs.runner import GraphRunner, normalize_mode
from ..base import Model

#: the prompt a class name is put in when the classes are names, not prompts (CLIP's ImageNet template)
TEMPLATE = "a photo of a {}."


def check_prompts(prompts: Any, template: Any = None) -> tuple[str, ...]:
    """``set_classes``' arguments checked: the prompts as a tuple (one clear error otherwise)."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError(f"set_classes takes a list of prompts, e.g. ['a cat', 'a dog'], got {prompts!r}")
    items = tuple(prompts)
    if not items or not all(isinstance(p, str) and p.strip() for p in items):
        raise ValueError(f"set_classes needs at least one prompt, each a non-empty string, got {list(items)!r}")
    if template is not None and (not isinstance(template, str) or "{}" not in template):
        raise ValueError(f"template must be a string with a {{}} placeholder, got {template!r}")
    return items


def _fingerprint(net: nn.Module) -> tuple:
    """What a cached text head depends on: the network and its weights (storage and in-place version)."""
    return (id(net), *((p.data_ptr(), p._version) for p in net.parameters()))


class ImageTextModel(Model):
    """Base of the image-text families' zero-shot classifier (see the module docstring)."""

    TASK = "classify"
    DEFAULT_NC = 1000   # the checkpoints' ImageNet-1k names
    STRIDE = 1          # the towers take one fixed size (DEFAULT_IMGSZ_BY_SIZE); no rounding to a stride
    SUPPORTS_CUDA_GRAPH = True   # proven on the GPU (docs/families.md, "CLIP and SigLIP 2")
    #: "softmax" (CLIP) or "sigmoid" (SigLIP 2): how the classify task turns the logits into probabilities
    PROBS: ClassVar[str] = "softmax"
    #: token lengths the text tower runs at (the shortest that holds a batch's longest prompt)
    TEXT_BUCKETS: ClassVar[tuple[int, ...]] = ()
    #: the network class (``nn.py``) and its tokenizer class (``libreyolo.text``)
    NET: ClassVar[type[nn.Module]]
    TOKENIZER: ClassVar[str] = ""
    #: prompts encoded per text-stage call (on CUDA every call has this many rows: one graph per bucket)
    TEXT_CHUNK: ClassVar[int] = 64
    #: fine-tuning recipe: small AdamW steps on pretrained towers, no EMA (see :meth:`train`)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "AdamW", "lr0": 1e-5, "lrf": 0.1, "momentum": 0.9, "weight_decay": 0.1,
        "warmup_epochs": 0.0, "warmup_bias_lr": 0.0, "cos_lr": True, "ema": False,
    }

    def __init__(self, net: nn.Module, **kwargs: Any):
        #: (prompts, template) of :meth:`set_classes`, or None: the class names in TEMPLATE
        self._prompts: tuple[tuple[str, ...], str | None] | None = None
        self._heads: dict = {}   # (network fingerprint, prompts) -> normalized text rows
        self._tokenizer = None
        self._text_mode: Any = False   # predict's cuda_graph while it runs (the class head it encodes)
        super().__init__(net, **kwargs)

    def _attach(self, net: nn.Module) -> None:
        """As :meth:`Model._attach`, with the text stage's own runner on the same network."""
        super()._attach(net)
        self.text_runner = GraphRunner(net, self.FAMILY, self.SUPPORTS_CUDA_GRAPH,
                                       unsupported_reason=self.UNSUPPORTED_REASON)

    # ------------------------------------------------------------------ network
    @classmethod
    def build_network(cls, size: str, nc: int = 0) -> nn.Module:
        """Both towers of ``size``; ``nc`` plays no part (the classes are text)."""
        if size not in cls.SIZES:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return cls.NET(size)

    @classmethod
    def sniff_size(cls, state_dict: dict[str, torch.Tensor], nc: int) -> str | None:
        return super().sniff_size(state_dict, 0)

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        """ImageNet-1k's class names (timm ships them) for the checkpoints' 1000 classes."""
        if nc == 1000:
            from ..common.timm_net import TimmClassifier
            return TimmClassifier.default_names(nc)
        return super().default_names(nc)

    def reset_classes(self, nc: int, names: Any = None) -> None:
        """Another class set (a dataset's): the network is unchanged (its classes are prompts)."""
        from ..common.names import normalize_names
        self.nc = int(nc)
        self.names = self.default_names(self.nc) if names is None else normalize_names(names, self.nc)
        self._prompts = None

    # ------------------------------------------------------------------ text
    @property
    def tokenizer(self):
        """The family's tokenizer (``libreyolo.text``; its package is the ``text`` extra)."""
        if self._tokenizer is None:
            from ... import text
            self._tokenizer = getattr(text, self.TOKENIZER)(context_length=self.model.context_length)
        return self._tokenizer

    def tokenize(self, texts: str | Sequence[str]) -> torch.Tensor:
        """Texts -> (T, L) int64 token ids at the shortest of ``TEXT_BUCKETS`` that holds them all."""
        ids = self.tokenizer(texts)
        used = int((ids != 0).sum(1).max()) if len(ids) else 1
        length = next((b for b in self.TEXT_BUCKETS if b >= used), ids.shape[1])
        return ids[:, :length].contiguous()

    def text_stage(self, net: nn.Module | None = None):
        """The text stage: (R, L) int64 token ids on the device -> (R, D) L2-normalized float32
        text embeddings (the tower, then the normalization; fixed shapes, no host synchronisation)."""
        net = self.model if net is None else net

        def text(input_ids: torch.Tensor) -> torch.Tensor:
            return F.normalize(net.encode_text(input_ids).float(), dim=-1)
        return text

    def text_key(self, length: int) -> tuple:
        """The text stage's graph key at token length ``length`` (the rows are in the signature)."""
        return (f"{self.FAMILY}-text", int(length))

    def encode_text_ids(self, input_ids: torch.Tensor, net: nn.Module | None = None,
                        cuda_graph: Any = False) -> torch.Tensor:
        """(T, L) token ids -> (T, D) L2-normalized float32 text embeddings on the device, through
        ``net`` (default: the model's network), ``TEXT_CHUNK`` at a time. With the model's own
        network and gradients off, each chunk is the text stage run by ``text_runner`` under
        ``cuda_graph`` (on CUDA a shorter chunk filled up with zero rows, whatever the mode: see
        the module docstring); another network (training's) or gradients on: the tower eager, as it is."""
        net = self.model if net is None else net
        dev = next(net.parameters()).device
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
            raise TypeError("input_ids must be a (T, L) int64 tensor of token ids")
        k = self.TEXT_CHUNK
        staged = net is self.model and not torch.is_grad_enabled()
        stage = self.text_stage(net)
        rows = []
        for i in range(0, len(input_ids), k):
            ids = input_ids[i:i + k].to(dev)
            if not staged:
                rows.append(stage(ids))
                continue
            n = ids.shape[0]
            if n < k and self.text_runner.capturer.can_capture(dev):   # CUDA: one shape per length, one graph
                ids = torch.cat((ids, ids.new_zeros((k - n, ids.shape[1]))))
            rows.append(self.text_runner(self.text_key(ids.shape[1]), stage, (ids,), cuda_graph)[:n])
        return torch.cat(rows) if rows else torch.zeros(0, net.embed_dim, device=dev)

    def embed_text(self, texts: str | Sequence[str], cuda_graph: Any = False) -> torch.Tensor:
        """Texts -> (T, D) L2-normalized text embeddings (float32, on the CPU), in the space of
        :meth:`embed`'s image embeddings: ``model.embed(img) @ model.embed_text(texts).T`` are
        cosine similarities. ``cuda_graph``: the text stage's mode (False, True, "auto"; see
        :meth:`encode_text_ids`)."""
        mode = normalize_mode(cuda_graph)
        ids = self.tokenize(texts)
        with torch.no_grad():
            return self.encode_text_ids(ids, cuda_graph=mode).cpu()

    def verify_cases(self, size: int, batch: int, source_hw: tuple[int, int]) -> list[tuple]:
        """``(name, fn, probe A, probe B)`` of the parity protocol for the stages this family runs
        besides predict's image stage (``libreyolo verify`` adds them): the text stage at each
        bucketed length, at the ``TEXT_CHUNK`` rows it runs with on CUDA. Probe A: ids drawn over
        the whole vocabulary; probe B: ids of the first eighth (another distribution)."""
        dev = next(self.model.parameters()).device
        vocab = int(self.model.config.vocab_size)
        g = torch.Generator().manual_seed(77)
        cases = []
        for length in self.TEXT_BUCKETS:
            a = torch.randint(0, vocab, (self.TEXT_CHUNK, length), generator=g)
            b = torch.randint(0, vocab // 8, (self.TEXT_CHUNK, length), generator=g)
            cases.append((f"text-stage L{length} rows{self.TEXT_CHUNK}", self.text_stage(), (a.to(dev),), (b.to(dev),)))
        return cases

    # ------------------------------------------------------------------ classes as prompts
    def set_classes(self, prompts: Sequence[str], template: str | None = None,
                    cuda_graph: Any = None) -> ImageTextModel:
        """Make ``prompts`` the classes: predict gives ``Results.probs`` over them (in this order;
        ``names`` maps each index to its prompt). ``template`` (e.g. ``"a photo of a {}."``) wraps
        each before it is encoded. The text embeddings are computed now, once, and cached, by the
        text stage under ``cuda_graph`` (default: False, or the running predict call's mode)."""
        mode = self._text_mode if cuda_graph is None else normalize_mode(cuda_graph)
        items = check_prompts(prompts, template)
        self._prompts = (items, template)
        self.nc = len(items)
        self.names = dict(enumerate(items))
        self.runner.release()   # a captured image-stage graph would hold the previous head
        self._predictor = None
        self.class_head(cuda_graph=mode)   # encode now: predict then reads the cache
        return self

    def prompts(self) -> list[str]:
        """The texts the classes are encoded from (prompts, or the names in ``TEMPLATE``)."""
        if self._prompts is None:
            return [TEMPLATE.format(self.names.get(i, str(i))) for i in range(self.nc)]
        items, template = self._prompts
        return [template.format(p) for p in items] if template else list(items)

    def class_head(self, net: nn.Module | None = None, cuda_graph: Any = None) -> torch.Tensor:
        """(nc, D) normalized text embeddings of the classes through ``net`` (default: the model's
        network), cached until the prompts or the weights change; encoded by the text stage under
        ``cuda_graph`` (default: False, or the running predict call's mode)."""
        net = self.model if net is None else net
        texts = tuple(self.prompts())
        key = (_fingerprint(net), texts)
        head = self._heads.get(key)
        if head is None:
            mode = self._text_mode if cuda_graph is None else normalize_mode(cuda_graph)
            with torch.no_grad():
                head = self.encode_text_ids(self.tokenize(list(texts)), net, cuda_graph=mode)
            self._heads = {key: head}   # one head kept: the weights or prompts changed
        return head

    def logits(self, image_emb: torch.Tensor, text_emb: torch.Tensor, net: nn.Module) -> torch.Tensor:
        """Normalized image (B, D) and text (K, D) rows -> (B, K) logits (the family's scale and bias)."""
        return net.logit_scale.exp().float() * image_emb @ text_emb.T

    def image_embedding(self, x: torch.Tensor, net: nn.Module | None = None) -> torch.Tensor:
        """Normalized images -> (B, D) L2-normalized float32 image embeddings."""
        return F.normalize(((self.model if net is None else net)(x)).float(), dim=-1)

    # ------------------------------------------------------------------ graphs
    def to(self, device: Any) -> ImageTextModel:
        before = self.device
        super().to(device)
        if self.device != before:
            self.text_runner.release()
        return self

    def graph_info(self) -> dict:
        """:meth:`Model.graph_info` with the text stage's graphs (one per bucketed length) and
        counts added; ``text`` holds the text runner's own statistics."""
        info = super().graph_info()
        text = self.text_runner.info()
        info["graphs"] = [*info["graphs"], *text["graphs"]]
        for k in ("captures", "replays", "eager_calls", "pool_bytes"):
            info[k] = info[k] + text[k]
        info["text"] = text
        return info

    def release_graphs(self) -> int:
        return super().release_graphs() + self.text_runner.release()

    # ------------------------------------------------------------------ predict / train hooks
    def predict(self, source: Any, **kwargs: Any) -> Any:
        """:meth:`Model.predict`; a class head not cached yet (or ``prompts=``) is encoded by the
        text stage under the call's ``cuda_graph``."""
        try:
            mode = normalize_mode(kwargs.get("cuda_graph", False))
        except ValueError:
            mode = False   # predict's own option check names the bad value
        self._text_mode = mode
        try:
            return super().predict(source, **kwargs)
        finally:
            self._text_mode = False

    __call__ = predict

    def get_predictor(self):
        self.class_head()   # encoded before predict starts, not inside its stage
        return super().get_predictor()

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalized images -> (B, nc) logits against the cached class head."""
        return self.logits(self.image_embedding(x), self.class_head(), self.model)

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """Fine-tuning on a classification set: the logits against the class prompts encoded by
        the training network (both towers get gradients); the classify task's cross-entropy."""
        head = self.encode_text_ids(self.tokenize(self.prompts()), net)
        return self.logits(self.image_embedding(x, net), head, net)

    def val_loss_outputs(self, net: nn.Module, out: Any, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """``out`` is the network's output (the image features): the logits against the class head."""
        return self.logits(F.normalize(out.float(), dim=-1), self.class_head(net), net)

    def train(self, **kwargs: Any) -> dict:
        """Fine-tune (see :meth:`Model.train`); the recipe is ``TRAIN_DEFAULTS`` at the towers'
        input size. ``ema=True`` is refused: validation encodes its prompts with the model's own
        text tower, which an EMA copy of the weights would not match."""
        if kwargs.get("ema"):
            from ...options import OptionError
            raise OptionError(f"{self.FAMILY} fine-tunes without EMA (ema=False): its validation pairs the image "
                              "and text towers of one network")
        kwargs.setdefault("imgsz", self.imgsz)
        if kwargs.get("imgsz") not in (None, self.imgsz):
            from ...options import OptionError
            raise OptionError(f"{self.FAMILY}-{self.size} takes {self.imgsz}x{self.imgsz} images only (its position "
                              f"embedding is not interpolated), got imgsz={kwargs['imgsz']}")
        if kwargs.get("nbs") is None:   # the loss is a per-batch mean: no accumulation
            kwargs["nbs"] = kwargs.get("batch") or 16
        return super().train(**kwargs)

    def train_defaults(self) -> dict[str, Any]:
        return {**self.TRAIN_DEFAULTS, "imgsz": self.imgsz}

    def val(self, data: Any = None, **kwargs: Any) -> dict:
        """Zero-shot top-1 / top-5 on a classification set: its class names become the classes
        (in ``TEMPLATE``) when their count differs from the model's."""
        if data is not None:
            ds = self.task_def.resolve_data(data)
            if ds.nc != self.nc or self._prompts is not None:
                self.reset_classes(ds.nc, ds.names)
        return super().val(data, **kwargs)

    # ------------------------------------------------------------------ embeddings
    def embedder(self) -> ImageTextEmbedder:
        """This model as an ``embed``-task model sharing its network and weights."""
        if isinstance(self, ImageTextEmbedder):
            return self
        cls = self.for_task("embed")
        twin = copy.copy(self)
        twin.__class__ = cls
        twin._attach(self.model)
        twin._heads = {}
        return twin

    def embed(self, images: Any, **kwargs: Any) -> torch.Tensor:
        """Images (anything predict takes) -> (N, D) L2-normalized image embeddings (float32, CPU),
        one row per image, in the space of :meth:`embed_text`."""
        results = self.embedder().predict(images, **kwargs)
        results = results if isinstance(results, list) else [results]
        if not results:
            return torch.zeros(0, self.model.embed_dim)
        return torch.stack([torch.as_tensor(r.embedding.data).float().cpu() for r in results])

    # ------------------------------------------------------------------ export
    def export(self, format: str = "onnx", **kwargs: Any) -> Path:
        """ONNX: the image tower (uint8-scale [0, 1] images -> normalized embeddings, the family's
        normalization inside) and the text tower (token ids -> normalized embeddings) as two graphs,
        ``<file>`` and ``<file stem>-text.onnx``; returns the image graph's path. Zero-shot logits
        are the family's scale (and bias) times the dot products of the two outputs. See
        :func:`libreyolo.tasks.embed.export.export_towers`."""
        if str(format).strip().lower() != "onnx":
            raise ValueError(f"{self.FAMILY} exports to ONNX only (its two towers as two graphs), got {format!r}")
        from ...tasks.embed.export import export_towers
        return export_towers(self, **kwargs)


class ImageTextEmbedder(ImageTextModel):
    """The image-text network under the ``embed`` task (see the module docstring)."""

    TASK = "embed"

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalized images -> (B, D) L2-normalized image embeddings, float32."""
        return self.image_embedding(x)

    def get_predictor(self):
        return Model.get_predictor(self)

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """Image / caption pairs: (image embeddings, caption embeddings, network) for the
        contrastive loss (:meth:`build_loss`); ``targets`` = (caption token ids, caption ids)."""
        input_ids = targets[0]
        return self.image_embedding(x, net), self.encode_text_ids(input_ids, net), net

    def val_loss_outputs(self, net: nn.Module, out: Any, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        return self.train_forward(net, x, *targets)

    def build_loss(self) -> nn.Module:
        from ...tasks.embed.task import ContrastiveLoss
        return ContrastiveLoss(self.PROBS == "sigmoid", self.logits)

    def val(self, data: Any = None, **kwargs: Any) -> dict:
        """Zero-shot top-1 and retrieval recall@k on ``data``'s validation split (the dataset's
        class prompts become the classes first)."""
        ds = self.task_def.resolve_data(data)
        if ds.nc != self.nc:
            self.reset_classes(ds.nc, ds.names)
        return super().val(data, **kwargs)
