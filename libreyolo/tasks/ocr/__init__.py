"""The ``ocr`` task: text detection + recognition (``Results.texts``)."""
from .results import TextLines
from .task import OcrPlan, OcrTask

__all__ = ["OcrPlan", "OcrTask", "TextLines"]
