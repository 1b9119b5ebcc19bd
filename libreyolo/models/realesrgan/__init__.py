"""Real-ESRGAN super-resolution (x2, x4, and the compact x4t): networks in ``nn``."""
