"""PP-OCR text detection + recognition family (networks in ``nn``, alphabet in ``charset``)."""
