"""FeyNobg declarations (matting): a thin family over BiRefNet's network and inference stage.

FeyNobg (Feyn Inc.'s background-removal model, code and weights Apache-2.0) is BiRefNet retrained
with the third stage of its Swin-L backbone deepened from 18 to 24 blocks. Every tensor name, the
forward, the preprocessing and the output (one matte logit at the input size) are BiRefNet's, so
this family is only its own declarations: the backbone configuration, the name, the checkpoint
file prefix and its capture status. The network is ``models/birefnet/nn.py``'s, built from
:data:`CONFIGS`; the layout is pinned by the ``feynobg-l`` fixture.
"""
from __future__ import annotations

from typing import ClassVar

from ..birefnet.model import BiRefNet
from ..birefnet.nn import SwinConfig

#: the single released size: Swin-L (embed 192, window 12) with depths 2-2-24-2
CONFIGS: dict[str, SwinConfig] = {
    "l": SwinConfig(192, (2, 2, 24, 2), (6, 12, 24, 48), 12),
}


class FeyNobg(BiRefNet):
    """FeyNobg, size l (262.8 M parameters); foreground matting (``task="matte"``).

    Everything but the declarations below is :class:`~libreyolo.models.birefnet.model.BiRefNet`'s:
    preprocessing (stretch to the 1024 square, PIL bilinear, ImageNet mean / std), the matte
    task's stage (sigmoid, alpha resized back to each image) and the predict seam
    (``PREDICT_SEAM``, the one declaration both families follow: the encoder captured, every
    ``deform_conv2d`` eager). Checkpoints are told from BiRefNet's by their stage depths (the
    same key names, 24 blocks in ``bb.layers.2``).

    Its predict seam is BiRefNet's code, proven on a GPU at this depth too (tests/rows.py
    ``MATTE_GRAPH_MODELS``; docs/families.md, "Matting").
    """

    FAMILY = "feynobg"
    CONFIGS: ClassVar[dict[str, SwinConfig]] = CONFIGS
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreFeyNobg"       # the LibreYOLO checkpoint names: LibreFeyNobgl.pt
    SUPPORTS_CUDA_GRAPH = True   # BiRefNet's seam: the GPU parity protocol and predict == eager passed
