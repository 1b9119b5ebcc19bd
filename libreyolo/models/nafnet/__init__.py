"""NAFNet image restoration (denoising / deblurring at the input's size): network in ``nn``."""
