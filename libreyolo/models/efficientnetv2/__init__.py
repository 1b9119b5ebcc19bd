"""EfficientNetV2 image classifiers (Tan & Le 2021), sizes b0-b3, s, m, l; networks built by timm."""
from .model import EfficientNetV2

__all__ = ["EfficientNetV2"]
