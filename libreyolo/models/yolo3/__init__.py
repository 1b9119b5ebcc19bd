"""YOLOv3 (Darknet-53, three [yolo] heads) detector family."""
