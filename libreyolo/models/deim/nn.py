"""DEIM sizes: the D-FINE network (:class:`~..dfine.nn.DFineNet`) with SiLU decoder activations.

DEIM (Huang et al. 2025) changes D-FINE's training (dense one-to-one matching, MAL loss); its
network is D-FINE's with ``activation: silu`` and ``mlp_act: silu`` in the decoder (configs
deim_hgnetv2_{n,s,m,l,x}_coco), so checkpoints share D-FINE's layout exactly. The L/X
backbones keep the frozen-BatchNorm layout of the LibreYOLO checkpoints.
"""
from __future__ import annotations

from ..dfine.nn import DFineConfig, with_decoder_activation

DEIM_CONFIGS: dict[str, DFineConfig] = with_decoder_activation("silu", ("n", "s", "m", "l", "x"))
