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
    see the loss module and docs/families.md ("DEIM's augmentation schedule") for what of DEIM's
    schedule is not reproduced.
    """

    FAMILY = "deim"
    SIZES = tuple(DEIM_CONFIGS)
    FILE_PREFIX = "LibreDEIM"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    SIGNATURE_KEYS = ()
    #: no segmentation variant (D-FINE's is D-FINE's own)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {}
    CONFIGS = DEIM_CONFIGS
    #: "deim" (MAL + the D-FINE terms); "dfine" / "rtdetr" fall back to DetrModel's criteria
    LOSS_KIND: ClassVar[str | None] = "deim"

    def build_loss(self) -> nn.Module:
        """DEIM's criterion (:class:`~..detr_common.loss.DeimLoss`) unless ``LOSS_KIND`` says otherwise."""
        if self.loss_kind() == "deim":
            from ..detr_common.loss import DeimLoss
            return DeimLoss(self.nc)
        return super().build_loss()
