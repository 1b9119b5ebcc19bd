"""EdgeCrafter ECDet detector family (ECViT backbone + hybrid encoder + FDR decoder)."""
from .model import EC
from .nn import EC_CONFIGS, ECConfig, ECNet

__all__ = ["EC", "ECNet", "ECConfig", "EC_CONFIGS"]
