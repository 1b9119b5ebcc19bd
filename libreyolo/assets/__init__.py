"""Files shipped with libreyolo.

``SAMPLE_IMAGE`` is a 1280x720 street scene (people, cars, a bicycle, a dog, a traffic light) painted
by ``scripts/make_sample_image.py``, so examples and smoke tests have an image without downloading one.
"""

from pathlib import Path

__all__ = ["SAMPLE_IMAGE"]

#: Absolute path of the bundled sample image (JPEG, 1280x720, RGB).
SAMPLE_IMAGE: str = str(Path(__file__).resolve().with_name("sample.jpg"))
