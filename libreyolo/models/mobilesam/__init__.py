"""MobileSAM promptable-segmentation family (network in ``nn``)."""
