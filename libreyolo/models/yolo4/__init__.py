"""YOLOv4 (CSPDarknet53, SPP, PAN, three [yolo] heads) detector family."""
