"""Depth Anything 3 (monocular relative depth: DA3-Mono)."""
