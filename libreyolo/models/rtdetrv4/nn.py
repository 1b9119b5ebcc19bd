"""RT-DETRv4 sizes: the D-FINE network (:class:`~..dfine.nn.DFineNet`) with SiLU decoder activations.

RT-DETRv4 (2025) distils a DINOv3 teacher into D-FINE-style students: the deployed network
is D-FINE's with ``activation: silu`` / ``mlp_act: silu`` in the decoder (configs
rtv4_hgnetv2_{s,m,l,x}_coco include the D-FINE size configs); the distillation projector of
the encoder exists only in training checkpoints and is not part of the layout.
"""
from __future__ import annotations

from ..dfine.nn import DFineConfig, with_decoder_activation

RTDETRV4_CONFIGS: dict[str, DFineConfig] = with_decoder_activation("silu", ("s", "m", "l", "x"))
