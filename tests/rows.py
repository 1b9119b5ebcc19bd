"""Registry-parametrized test rows: adding a family adds rows here, not new test files."""

# (family, size, fixture name) for every architecture fixture a family reproduces.
FIXTURES = [
    ("yolo9", "t", "yolo9-t"),
    ("yolo9", "s", "yolo9-s"),
    ("yolox", "n", "yolox-n"),
    ("yolox", "t", "yolox-t"),
    ("yolox", "s", "yolox-s"),
    ("yolo7", "b", "yolo7-b"),
    ("rtmdet", "t", "rtmdet-t"),
    ("picodet", "s", "picodet-s"),
]

# (family, size) built untrained for the fast CPU predict / checkpoint tests.
SMALL_MODELS = [
    ("yolo9", "t"),
    ("yolox", "n"),
    ("yolo7", "tiny"),
    ("rtmdet", "t"),
    ("picodet", "s"),
]

# (family, size) that must pass the GPU parity protocol.
GRAPH_MODELS = [
    ("yolo9", "t"),
    ("yolo9", "s"),
]
