"""ZipDepth (lightweight monocular relative depth, re-parameterizable CNN)."""
