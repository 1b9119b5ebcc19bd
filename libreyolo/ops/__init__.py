"""Image and box operations shared by every family: letterbox, NMS."""
from .letterbox import LetterboxParams, letterbox, letterbox_params, unletterbox_boxes
from .nms import batched_detections

__all__ = ["LetterboxParams", "letterbox", "letterbox_params", "unletterbox_boxes", "batched_detections"]
