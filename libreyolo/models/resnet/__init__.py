"""ResNet image classifiers (He et al. 2015), sizes 18, 34, 50, 101, 152; networks built by timm."""
from .model import ResNet

__all__ = ["ResNet"]
