"""ConvNeXt image classifiers (Liu et al. 2022), sizes t, s, b, l; networks built by timm."""
from .model import ConvNeXt

__all__ = ["ConvNeXt"]
