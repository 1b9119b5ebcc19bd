"""SwinIR 4x super-resolution (lightweight s, real-world m and l): network in ``nn``."""
