"""LingBot-Vision semantic-segmentation family (network in ``nn``)."""
