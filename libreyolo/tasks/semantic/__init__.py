"""Semantic segmentation (a class per pixel): predict plan, datasets, loss, evaluator, results."""
from .metrics import SemanticEvaluator, metrics_from_confusion
from .results import SemanticMask
from .task import SemanticLoss, SemanticOptions, SemanticPlan, SemanticTask

__all__ = ["SemanticEvaluator", "SemanticLoss", "SemanticMask", "SemanticOptions", "SemanticPlan", "SemanticTask",
           "metrics_from_confusion"]
