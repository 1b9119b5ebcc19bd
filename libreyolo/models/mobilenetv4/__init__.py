"""MobileNetV4 image classifiers (Qin et al. 2024), conv s/m/l and hybrid m/l; networks built by timm."""
from .model import MobileNetV4

__all__ = ["MobileNetV4"]
