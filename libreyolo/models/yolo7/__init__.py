"""YOLOv7 (anchor-based, implicit-knowledge head) detector family."""
