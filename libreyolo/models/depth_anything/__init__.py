"""Depth Anything V2 (monocular relative depth)."""
