"""DEIM declarations (the inference stage is DetrModel's; the criterion is DEIM's own)."""
from __future__ import annotations

from typing import ClassVar

from torch import nn

from ..dfine.model import Dfine
from .nn import DEIM_CONFIGS


class Deim(Dfine):
    """DEIM (D-FINE network trained with dense one-to-one matching and MAL), sizes n-x.

    The checkpoint layout is D-FINE's, key for key: no state-dict key can tell them apart, so
    ``SIGNATURE_KEYS`` is empty and a bare state dict is read as D-FINE; the ``model_family``
    metadata or a ``LibreDEIM<size>.pt`` file name selects DEIM.

    Training uses :class:`~..detr_common.loss.DeimLoss` (``LOSS_KIND = "deim"``): D-FINE's recipe
    with the matchability-aware loss in place of VFL (items ``mal, bbox, giou, fgl, ddf``).
    Dense O2O, DEIM's data-side half, is the trainer's mosaic (``mosaic=``, ``close_mosaic=``);
    see the loss module and the issue note for what of DEIM's schedule is not reproduced.
    """

    FAMILY = "deim"
    SIZES = tuple(DEIM_CONFIGS)
    FILE_PREFIX = "LibreDEIM"
    # Parity protocol passed on an H200 for size n (fp32 and fp16 autocast, batch 1 and 8, network and
    # predict stage, both probes distinct under autocast): session-3 GPU run A, 2026-11-30,
    # scripts/gpu_families.py (benchmarks/results/session3/runA-families-detr.json).
    SUPPORTS_CUDA_GRAPH = True
    SIGNATURE_KEYS = ()
    CONFIGS = DEIM_CONFIGS
    #: "deim" (MAL + the D-FINE terms); "dfine" / "rtdetr" fall back to DetrModel's criteria
    LOSS_KIND: ClassVar[str | None] = "deim"

    def build_loss(self) -> nn.Module:
        """DEIM's criterion (:class:`~..detr_common.loss.DeimLoss`) unless ``LOSS_KIND`` says otherwise."""
        if self.loss_kind() == "deim":
            from ..detr_common.loss import DeimLoss
            return DeimLoss(self.nc)
        return super().build_loss()
