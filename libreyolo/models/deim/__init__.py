"""DEIM detector family (the D-FINE network with SiLU decoder activations)."""
from .model import Deim
from .nn import DEIM_CONFIGS

__all__ = ["Deim", "DEIM_CONFIGS"]
