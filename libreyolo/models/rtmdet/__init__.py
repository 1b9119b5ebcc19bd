"""RTMDet detector family."""
from .model import Rtmdet

__all__ = ["Rtmdet"]
