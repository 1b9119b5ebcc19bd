"""SAM 2 promptable-segmentation family, images and video (transformers networks in ``nn``)."""
