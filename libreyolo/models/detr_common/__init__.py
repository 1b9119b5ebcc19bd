"""Blocks shared by the DETR-style detector families (RT-DETR, RT-DETRv2, D-FINE, DEIM, ...).

``model.py`` holds :class:`DetrModel`, the declarations and inference stage every DETR
family subclasses; the network blocks live beside it (``presnet``, ``hybrid_encoder``,
``deformable``, ``rtdetr_decoder``) so that each family folder only holds its config.
"""
