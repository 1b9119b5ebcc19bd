"""D-FINE detector family (HGNetv2 + hybrid encoder + fine-grained distribution refinement)."""
from .model import Dfine
from .nn import DFINE_CONFIGS, DFineConfig, DFineNet

__all__ = ["Dfine", "DFineNet", "DFineConfig", "DFINE_CONFIGS"]
