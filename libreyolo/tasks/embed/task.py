"""Image embeddings: predict, contrastive training and zero-shot / retrieval validation.

Predict stage (on the device): ``model.infer`` is the image tower with its embedding
L2-normalized, (B, D) float32; the stage hands it to the host as it is and each row becomes
``Results.embedding`` (:class:`~.results.Embedding`).

Training (:mod:`.data`): image / caption pairs - the built-in ``shapes-captions`` set, or a
classification dataset whose class names become captions. The family's training forward gives
both towers' normalized embeddings of the batch; :class:`ContrastiveLoss` is CLIP's symmetric
cross-entropy over the batch's image-caption similarities or SigLIP's pairwise sigmoid loss.
Two items of a batch with the same caption are both positives for each other (a synthetic set
repeats its captions), so the loss never pushes a caption away from its own kind of picture.

Validation: zero-shot top-1 / top-5 over the dataset's class prompts (the primary metric,
``top1``), image-to-text retrieval recall@1 / @5 over the split's distinct captions (an image
hits when one of its k nearest captions is its own) and text-to-image recall@1 (a caption hits
when its nearest image carries it). The text side is encoded by the model's own network once per
evaluation (the families fine-tune without EMA for that reason: ``ImageTextModel.train``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...options import check_fields
from ..base import Evaluator, PredictPlan, Task, TaskOptions

#: the metrics of a validation, ``top1`` first (the fitness)
METRICS = ("top1", "top5", "recall@1", "recall@5", "text_recall@1")


@dataclass
class EmbedOptions(TaskOptions):
    """The embed task's training options (none of its own yet)."""

    def __post_init__(self) -> None:
        check_fields(self)


class EmbedPlan(PredictPlan):
    """One embed predict call: the normalized image embeddings, one Results each."""

    host = True
    tag = ("embed",)

    def __init__(self, model):
        self.model = model

    def finish(self, emb: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        return emb.float()

    def results(self, out, chunk, size, speed):
        from ...results import Results
        from .results import Embedding
        host = out.wait()
        # clones: the pinned host buffer is reused by a later call's outputs
        return [Results(it.image, it.name, self.model.names, None, speed=dict(speed),
                        embedding=Embedding(host[i].clone())) for i, it in enumerate(chunk)]


class ContrastiveLoss(nn.Module):
    """``loss((image_emb, text_emb, net), token_ids, caption_ids, classes)``: the contrastive loss of
    a batch of normalized image and caption embeddings (B, D) each, ``logits(img, txt, net)`` the
    family's scaled similarities (B, B). ``sigmoid``: SigLIP's loss, ``-log sigmoid(z_ij l_ij)``
    summed over the pairs and divided by B (z = +1 for a pair of one caption, -1 otherwise); else
    CLIP's, the mean of the image-to-text and text-to-image cross-entropies, the target of a row
    spread evenly over the items with its caption. Fixed shapes, no host synchronisation."""

    item_names = ("contrastive",)

    def __init__(self, sigmoid: bool, logits):
        super().__init__()
        self.sigmoid = bool(sigmoid)
        self.logits = logits

    def forward(self, outputs, token_ids: torch.Tensor, caption_ids: torch.Tensor, *rest: torch.Tensor):
        img, txt, net = outputs
        logits = self.logits(img, txt, net).float()
        same = (caption_ids[:, None] == caption_ids[None, :]).to(logits.dtype)
        if self.sigmoid:
            loss = -F.logsigmoid((2 * same - 1) * logits).sum() / logits.shape[0]
        else:
            target = same / same.sum(1, keepdim=True)
            loss = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target.T))
        return loss, loss.detach().reshape(1)


class EmbedEvaluator(Evaluator):
    """Zero-shot top-1 / top-5 and retrieval recall@k of a validation split (module docstring)."""

    def __init__(self, model):
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.emb: list[torch.Tensor] = []
        self.caps: list[torch.Tensor] = []
        self.cls: list[torch.Tensor] = []
        self.caption_ids: dict[int, torch.Tensor] = {}

    def process(self, outputs: torch.Tensor, batch) -> None:
        _, ids, caps, cls = batch
        self.emb.append(outputs.float())
        self.caps.append(caps.to(outputs.device))
        self.cls.append(cls.to(outputs.device))
        for c, row in zip(caps.tolist(), ids):
            self.caption_ids.setdefault(int(c), row)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if not self.emb:
            return {k: float("nan") for k in METRICS}
        m = self.model
        emb, caps, cls = torch.cat(self.emb), torch.cat(self.caps), torch.cat(self.cls)
        head = m.class_head().to(emb.device)
        k = min(5, head.shape[0])
        top = (emb @ head.T).topk(k, dim=1).indices
        hit = top == cls[:, None]
        keys = sorted(self.caption_ids)
        text = m.encode_text_ids(torch.stack([self.caption_ids[c] for c in keys])).to(emb.device)
        col = {c: i for i, c in enumerate(keys)}
        own = torch.tensor([col[int(c)] for c in caps.tolist()], device=emb.device)
        sim = emb @ text.T                                              # (N images, C captions)
        rank = (sim > sim.gather(1, own[:, None])).sum(1)               # captions scored above the image's own
        nearest = sim.argmax(0)                                         # each caption's nearest image
        t2i = (own[nearest] == torch.arange(len(keys), device=emb.device)).float().mean()
        return {"top1": hit[:, 0].float().mean().item(), "top5": hit.any(1).float().mean().item(),
                "recall@1": (rank < 1).float().mean().item(), "recall@5": (rank < 5).float().mean().item(),
                "text_recall@1": t2i.item()}


class EmbedTask(Task):
    name = "embed"
    primary_metric = "top1"
    Options = EmbedOptions
    predict_defaults: dict = {}

    def plan(self, model, size, constants, **opts) -> EmbedPlan:
        return EmbedPlan(model)

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from .data import resolve_embed_data
        return resolve_embed_data(data)

    def prepare_model(self, model, data) -> None:
        """The dataset's class prompts become the model's classes (zero-shot validation)."""
        set_classes = getattr(model, "set_classes", None)
        if set_classes is None:
            raise ValueError(f"the embed task needs a model with a text tower (CLIP, SigLIP 2); "
                             f"{model.FAMILY} has none")
        set_classes(list(data.prompts))

    def datasets(self, data, imgsz, model, options):
        from .data import EmbedCollate, EmbedDataset
        captions = sorted({s.caption for s in data.train} | {s.caption for s in data.val})
        index = {c: i for i, c in enumerate(captions)}
        ids = model.tokenize(captions)
        prep = model.preprocess
        return (EmbedDataset(data.train, imgsz, prep, index, data.side),
                EmbedDataset(data.val, imgsz, prep, index, data.side), EmbedCollate(ids))

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options) -> EmbedEvaluator:
        return EmbedEvaluator(model)

    def metric_columns(self, metrics) -> dict[str, float]:
        return {f"metrics/{k}": metrics[k] for k in METRICS}

    def summary(self, metrics) -> str:
        return (f"top1 {metrics['top1']:.4f}  recall@1 {metrics['recall@1']:.4f}  "
                f"recall@5 {metrics['recall@5']:.4f}  text_recall@1 {metrics['text_recall@1']:.4f}")

    def empty_metrics(self) -> dict[str, float]:
        return {k: float("nan") for k in METRICS}

    def build_loss(self, model) -> nn.Module:
        raise NotImplementedError(f"the embed task trains image-text families (CLIP, SigLIP 2), not {model.FAMILY}")
