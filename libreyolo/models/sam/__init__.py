"""SAM (Segment Anything, ViT-B / L / H) on transformers' modules; see model.py."""
