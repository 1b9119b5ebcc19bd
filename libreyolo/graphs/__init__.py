"""The CUDA-graph engine: capture, inference runner, parity protocol.

Imports torch only and never a model family: families declare what is capturable,
the engine captures, replays, invalidates and reports.
"""
from .cache import GraphCache, signature
from .capture import CAPTURE_LOCK, CapturedGraph, CudaGraphCapturer
from .runner import GraphRunner, GraphUnavailableError

__all__ = ["CAPTURE_LOCK", "CapturedGraph", "CudaGraphCapturer", "GraphCache", "GraphRunner", "GraphUnavailableError",
           "signature"]
