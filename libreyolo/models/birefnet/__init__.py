"""BiRefNet (matting): Swin v1 encoder at two scales, deformable-convolution decoder."""
