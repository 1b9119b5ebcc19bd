"""PicoDet detector family."""
from .model import Picodet

__all__ = ["Picodet"]
