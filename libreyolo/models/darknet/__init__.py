"""The Darknet building blocks shared by the YOLOv2, YOLOv3 and YOLOv4 families.

``cfgs``: the original Darknet cfg files (pjreddie/darknet for v2 and v3, AlexeyAB/darknet for
v4) as Python layer lists; ``nn``: the layers, the network built from a cfg and the head decode;
``loss``: the classic YOLO losses ([region] for v2, [yolo] for v3 and v4); ``model``: the family
class the three families subclass.
"""
