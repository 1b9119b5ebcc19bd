"""FeyNobg (matting): BiRefNet's network with a 24-block third Swin-L stage."""
