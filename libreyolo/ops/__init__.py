"""Image and box operations shared by every family: letterbox, NMS."""
from .letterbox import LetterboxParams, letterbox, letterbox_params, unletterbox_boxes
from .nms import nms_per_image, top_candidates

__all__ = ["LetterboxParams", "letterbox", "letterbox_params", "unletterbox_boxes", "nms_per_image", "top_candidates"]
