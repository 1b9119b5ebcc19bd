"""FOMO point-detection family (MobileNetV2 cut at 1/8, a per-cell centroid map; network in ``nn``)."""
