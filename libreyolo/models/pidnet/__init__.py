"""PIDNet semantic-segmentation family (network in ``nn``, training loss in ``loss``)."""
