"""EoMT: the Encoder-only Mask Transformer (semantic, instance and panoptic segmentation)."""
