"""Image classification: predict plan (softmax + top-k on the device), datasets, evaluator, loss."""
from .results import Probs
from .task import ClassificationEvaluator, ClassifyLoss, ClassifyOptions, ClassifyPlan, ClassifyTask

__all__ = ["ClassificationEvaluator", "ClassifyLoss", "ClassifyOptions", "ClassifyPlan", "ClassifyTask", "Probs"]
