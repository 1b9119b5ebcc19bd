"""SigLIP 2: zero-shot classification (sigmoid per prompt) and image / text embeddings."""
