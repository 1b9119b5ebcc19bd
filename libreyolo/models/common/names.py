"""Default class names (COCO's 80, in the usual contiguous order)."""

COCO80 = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant",
    "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush",
)


def default_names(nc: int) -> dict[int, str]:
    """COCO names when ``nc == 80``, else ``class0``, ``class1``..."""
    if nc == len(COCO80):
        return dict(enumerate(COCO80))
    return {i: f"class{i}" for i in range(nc)}


def normalize_names(names, nc: int) -> dict[int, str]:
    """Accept a list, a dict with int or str keys, or None; return {int: str} of length nc."""
    if names is None:
        return default_names(nc)
    if isinstance(names, (list, tuple)):
        out = {i: str(n) for i, n in enumerate(names)}
    elif isinstance(names, dict):
        out = {int(k): str(v) for k, v in names.items()}
    else:
        raise TypeError(f"names must be a list or a dict, got {type(names).__name__}")
    if len(out) != nc or sorted(out) != list(range(nc)):
        raise ValueError(f"names must cover classes 0..{nc - 1} exactly, got {len(out)} entries")
    return out
