"""SAM 3 promptable-segmentation family (the tracker: points, boxes, masks; images and video), transformers networks in ``nn``."""
