"""DEIM declarations (the inference stage is DetrModel's)."""
from __future__ import annotations

from ..dfine.model import Dfine
from .nn import DEIM_CONFIGS


class Deim(Dfine):
    """DEIM (D-FINE network trained with dense one-to-one matching), sizes n-x.

    The checkpoint layout is D-FINE's, key for key: no state-dict key can tell them apart, so
    ``SIGNATURE_KEYS`` is empty and a bare state dict is read as D-FINE; the ``model_family``
    metadata or a ``LibreDEIM<size>.pt`` file name selects DEIM.
    """

    FAMILY = "deim"
    SIZES = tuple(DEIM_CONFIGS)
    FILE_PREFIX = "LibreDEIM"
    SUPPORTS_CUDA_GRAPH = False
    SIGNATURE_KEYS = ()
    CONFIGS = DEIM_CONFIGS
