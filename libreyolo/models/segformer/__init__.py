"""SegFormer semantic-segmentation family (network in ``nn``)."""
