"""YOLOv2 (Darknet-19 with the passthrough, [region] head) detector family."""
