"""RT-DETRv4 detector family (the D-FINE network with SiLU decoder activations)."""
from .model import RTDETRv4
from .nn import RTDETRV4_CONFIGS

__all__ = ["RTDETRv4", "RTDETRV4_CONFIGS"]
