"""Promptable segmentation (points / boxes -> masks): prompts, the two-stage predictor, results."""
from .predictor import PromptPredictor
from .prompts import Prompt, parse_prompt
from .results import PromptMasks
from .task import SegmentPromptTask

__all__ = ["Prompt", "PromptMasks", "PromptPredictor", "SegmentPromptTask", "parse_prompt"]
