"""Image embeddings and contrastive image-text training (CLIP, SigLIP 2): predict gives
``Results.embedding``; train / val on image-caption pairs (zero-shot top-1, retrieval recall@k)."""
from .results import Embedding
from .task import ContrastiveLoss, EmbedEvaluator, EmbedPlan, EmbedTask

__all__ = ["ContrastiveLoss", "EmbedEvaluator", "EmbedPlan", "EmbedTask", "Embedding"]
