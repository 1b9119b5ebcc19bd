"""Files shipped with libreyolo.

``SAMPLE_IMAGE`` is a 1280x720 street scene (people, cars, a bicycle, a dog, a traffic light) painted
by ``scripts/make_sample_image.py``, so examples and smoke tests have an image without downloading one.

``PPOCRV5_DICT`` is the PP-OCRv5 character dictionary the PP-OCR recognizer's checkpoints expect (from
PaddleOCR, Apache-2.0: see ``NOTICE`` and ``LICENSE-PaddleOCR.txt`` here).
"""

from pathlib import Path

__all__ = ["PPOCRV5_DICT", "SAMPLE_IMAGE"]

#: Absolute path of the bundled sample image (JPEG, 1280x720, RGB).
SAMPLE_IMAGE: str = str(Path(__file__).resolve().with_name("sample.jpg"))

#: Absolute path of the PP-OCRv5 character dictionary (UTF-8, one character per line, 18,383 lines).
PPOCRV5_DICT: str = str(Path(__file__).resolve().with_name("ppocrv5_dict.txt"))
