"""Object detection (boxes): predict plan, datasets, evaluator."""
from .task import DetectionEvaluator, DetectOptions, DetectPlan, DetectTask

__all__ = ["DetectionEvaluator", "DetectOptions", "DetectPlan", "DetectTask"]
