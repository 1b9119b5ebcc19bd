"""DEIMv2 detector family (HGNetv2 + lite / hybrid encoder + RMSNorm/SwiGLU FDR decoder)."""
from .model import Deimv2
from .nn import DEIMV2_CONFIGS, DEIMv2Config, DEIMv2Net

__all__ = ["Deimv2", "DEIMv2Net", "DEIMv2Config", "DEIMV2_CONFIGS"]
