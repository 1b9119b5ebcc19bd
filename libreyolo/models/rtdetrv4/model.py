"""RT-DETRv4 declarations (the inference stage is DetrModel's)."""
from __future__ import annotations

from typing import ClassVar

from ..dfine.model import Dfine
from .nn import RTDETRV4_CONFIGS


class RTDETRv4(Dfine):
    """RT-DETRv4 (D-FINE-style students distilled from a vision foundation model), sizes s-x.

    The checkpoint layout is D-FINE's (and DEIM's) for the same size, key for key, so
    ``SIGNATURE_KEYS`` is empty: a bare state dict is read as D-FINE; the ``model_family``
    metadata or a ``LibreRTDETRv4<size>.pt`` file name selects RT-DETRv4.
    """

    FAMILY = "rtdetrv4"
    SIZES = tuple(RTDETRV4_CONFIGS)
    FILE_PREFIX = "LibreRTDETRv4"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    SIGNATURE_KEYS = ()
    #: no segmentation variant (D-FINE's is D-FINE's own)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {}
    CONFIGS = RTDETRV4_CONFIGS
