"""EdgeTAM promptable-segmentation family (transformers network in ``nn``)."""
