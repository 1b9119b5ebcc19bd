"""CLIP: zero-shot classification and image / text embeddings (OpenCLIP's ViT-B/32, B/16, L/14)."""
