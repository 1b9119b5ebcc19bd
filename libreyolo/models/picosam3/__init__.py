"""PicoSAM3: a box-prompted ROI segmenter (depthwise U-Net with channel attention); see model.py."""
