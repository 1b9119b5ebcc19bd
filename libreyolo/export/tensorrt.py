"""``model.export(format="engine")``: a TensorRT engine built from the ONNX export, and its runtime.

The engine is built with TensorRT's Python API from the graph :func:`libreyolo.export.onnx.export_onnx`
writes (the network and the task's post-processing; TensorRT's ONNX parser imports the
detection graph's ``NonMaxSuppression`` as its NMS layer, TensorRT 8.5 and later): ``half=True``
lets TensorRT choose float16 kernels per layer (the ONNX graph stays float32), ``int8=True``
calibrates int8 ranges on a dataset's training images (TensorRT's entropy calibrator, ``data=``);
a dynamic graph gets one optimization profile (batch 1 .. ``batch``, the exported size up to
twice it). The build and the run need an NVIDIA GPU, CUDA and the ``tensorrt`` package; without
them both are refused with an error that says what is missing.

File: ``<stem>.engine`` = the magic ``LIBREYOLO-TRT1``, the length of the metadata (4 bytes,
little endian), the ONNX export's metadata as JSON (the same keys as its ``metadata_props``, plus
``precision``), then TensorRT's serialized engine. An engine is specific to the GPU model and the
TensorRT version that built it. :class:`TensorrtModel` (``LibreYOLO("x.engine")``) runs it behind
the predict API, with :class:`~libreyolo.export.onnx_model.OnnxModel`'s host side.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .onnx_model import OnnxModel

log = logging.getLogger(__name__)

MAGIC = b"LIBREYOLO-TRT1"
#: TensorRT's builder workspace (bytes) unless ``workspace=`` (GiB) says otherwise
DEFAULT_WORKSPACE_GIB = 4.0
#: tasks whose export is one graph (OCR and promptable segmentation export two: not built here)
ENGINE_TASKS = ("detect", "segment", "obb", "pose", "classify", "semantic", "depth", "matte")


def require_tensorrt(what: str = "TensorRT engines"):
    """Import tensorrt and check for a CUDA GPU, or say what is missing."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} need an NVIDIA GPU with CUDA: torch sees none (torch.cuda.is_available() is "
                           "False); build and run the engine on the GPU machine, or use format='onnx' / 'openvino'")
    try:
        import tensorrt
    except ImportError as exc:
        raise ImportError(f"{what} need the 'tensorrt' package (NVIDIA's wheels: pip install tensorrt; it must match "
                          "the machine's CUDA); or use format='onnx' with onnxruntime-gpu") from exc
    return tensorrt


def write_engine(path: Path, meta: dict[str, str], engine: bytes) -> None:
    """The engine file: magic, metadata length, metadata JSON, TensorRT's serialized engine."""
    from .onnx import write_atomic
    header = json.dumps(meta).encode()
    write_atomic(MAGIC + struct.pack("<I", len(header)) + header + bytes(engine), path)


def read_engine(path: str | os.PathLike) -> tuple[dict[str, str], bytes]:
    """(metadata, serialized engine) of an engine file written by :func:`write_engine`."""
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise ValueError(f"{path} is not a libreyolo TensorRT engine (no '{MAGIC.decode()}' header); export it with "
                         "model.export(format='engine')")
    n = struct.unpack("<I", data[len(MAGIC):len(MAGIC) + 4])[0]
    start = len(MAGIC) + 4
    try:
        meta = json.loads(data[start:start + n])
    except ValueError as exc:
        raise ValueError(f"{path}: the engine's metadata is corrupt ({exc}); export it again") from exc
    return meta, data[start + n:]


def default_engine_path(model) -> Path:
    from .onnx import default_path
    return default_path(model).with_suffix(".engine")


def engine_onnx(model, path: Path, **onnx_opts: Any) -> Path:
    """The ONNX graph an engine is built from (float32; TensorRT picks the kernels' precision)."""
    if model.TASK not in ENGINE_TASKS:
        raise ValueError(f"the {model.TASK} task exports two ONNX graphs (docs/export.md); format='engine' builds "
                         f"one-graph tasks ({', '.join(ENGINE_TASKS)}): use format='onnx'")
    from .onnx import export_onnx
    return export_onnx(model, path, half=False, **onnx_opts)


def export_engine(model, file: str | os.PathLike | None = None, *, half: bool = False, int8: bool = False,
                  data: Any = None, workspace: float = DEFAULT_WORKSPACE_GIB, **onnx_opts: Any) -> Path:
    """Build and write ``model``'s TensorRT engine; returns its path (``<stem>.engine``).

    ``half``: float16 kernels allowed; ``int8``: int8 kernels allowed, calibrated on ``data``'s
    training images (:func:`libreyolo.export.openvino.calibration_images`); ``workspace``: the
    builder's memory pool in GiB; ``onnx_opts``: the ONNX export's options (imgsz, batch,
    dynamic, opset, max_det, max_nms, agnostic_nms, topk).
    """
    from ..options import parse_bool
    half, int8 = parse_bool("half", half), parse_bool("int8", int8)
    if int8 and data is None:
        raise ValueError("int8=True needs calibration images: pass data= (a built-in set or a dataset YAML)")
    if not int8 and data is not None:
        raise ValueError("data= is the int8 calibration set; it is used only with int8=True")
    if model.TASK not in ENGINE_TASKS:   # refused before anything needs a GPU
        raise ValueError(f"the {model.TASK} task exports two ONNX graphs (docs/export.md); format='engine' builds "
                         f"one-graph tasks ({', '.join(ENGINE_TASKS)}): use format='onnx'")
    trt = require_tensorrt("TensorRT engine builds")
    path = Path(file).expanduser() if file is not None else default_engine_path(model)
    if path.suffix.lower() != ".engine":
        raise ValueError(f"the TensorRT export writes a .engine file, got {str(path)!r}")
    from .onnx import read_metadata
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = engine_onnx(model, Path(tmp) / f"{path.stem}.onnx", **onnx_opts)
        meta = read_metadata(onnx_path)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        flags = 0
        if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):   # TensorRT < 10 needs it
            flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT {trt.__version__}'s ONNX parser refused the {model.FAMILY}-{model.size} "
                               f"graph: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(float(workspace) * (1 << 30)))
        if json.loads(meta["dynamic"]):
            size, batch = int(meta["imgsz"]), int(meta["batch"])
            profile = builder.create_optimization_profile()
            inp = network.get_input(0)
            profile.set_shape(inp.name, (1, 3, size, size), (batch, 3, size, size), (batch, 3, 2 * size, 2 * size))
            config.add_optimization_profile(profile)
        if half:
            config.set_flag(trt.BuilderFlag.FP16)
        if int8:
            config.set_flag(trt.BuilderFlag.INT8)
            config.int8_calibrator = _calibrator(trt, model, data, int(meta["imgsz"]), Path(tmp) / "calib.cache")
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise RuntimeError(f"TensorRT {trt.__version__} could not build an engine for {model.FAMILY}-{model.size} "
                               "(see its log above)")
    meta.update(precision="int8" if int8 else "fp16" if half else "fp32", tensorrt_version=trt.__version__,
                gpu=torch.cuda.get_device_name())
    write_engine(path, meta, serialized)
    log.info("exported %s-%s to %s (TensorRT %s, %s, %.1f s)", model.FAMILY, model.size, path, trt.__version__,
             meta["precision"], time.perf_counter() - t0)
    return path


def _calibrator(trt, model, data: Any, size: int, cache: Path):
    """TensorRT's entropy calibrator over the calibration images (one at a time, resized as
    predict resizes them), fed from CUDA tensors."""
    from .openvino import calibration_images
    items = calibration_images(model, data)

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            super().__init__()
            self.i, self.current = 0, None

        def get_batch_size(self):
            return 1

        def get_batch(self, names):
            if self.i >= len(items):
                return None
            x = model.preprocess.resize_images(torch.as_tensor(items[self.i].image)[None], size)
            self.current = x.contiguous().cuda()
            self.i += 1
            return [int(self.current.data_ptr())]

        def read_calibration_cache(self):
            return cache.read_bytes() if cache.is_file() else None

        def write_calibration_cache(self, blob):
            cache.write_bytes(bytes(blob))

    return Calibrator()


class TensorrtModel(OnnxModel):
    """A ``.engine`` written by ``model.export(format="engine")``, with ``Model``'s predict API:
    the engine on the GPU (TensorRT), the host side as :class:`OnnxModel`'s."""

    BACKEND = "tensorrt"
    KIND = "TensorRT"

    def __init__(self, path: str | os.PathLike, device: Any = "auto", *, threads: int | None = None):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"TensorRT engine {str(self.path)!r} not found")
        meta, blob = read_engine(self.path)   # the header is checked before anything needs a GPU
        trt = require_tensorrt("TensorRT engines")
        self._trt = trt
        self._init_meta(meta, threads)
        self.precision = meta.get("precision", "fp32")
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise ValueError(f"cannot load TensorRT engine '{self.path}': TensorRT {trt.__version__} refused it (built "
                             f"with TensorRT {meta.get('tensorrt_version')} on {meta.get('gpu')}); export it again here")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == mode]
        self.output_names = json.loads(meta["outputs"])
        self.to(device)

    def to(self, device: Any) -> TensorrtModel:
        text = "auto" if device is None else str(device).strip().lower()
        if text not in ("auto", "cuda", "cuda:0", "0"):
            raise ValueError(f"device {device!r}: a TensorRT engine runs on the GPU it was loaded on (cuda:0)")
        self.device, self.providers = torch.device("cpu"), ["TensorRT"]   # host side on the CPU, as OnnxModel
        return self

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        trt, ctx, eng = self._trt, self.context, self.engine
        keep = []
        for name in self.input_names:
            t = torch.from_numpy(np.ascontiguousarray(feeds[name])).cuda()
            keep.append(t)
            ctx.set_input_shape(name, tuple(t.shape))
            ctx.set_tensor_address(name, int(t.data_ptr()))
        outs = {}
        for name in self.output_names:
            shape = tuple(ctx.get_tensor_shape(name))
            dtype = torch.from_numpy(np.empty(0, dtype=trt.nptype(eng.get_tensor_dtype(name)))).dtype
            outs[name] = torch.empty(shape, dtype=dtype, device="cuda")
            ctx.set_tensor_address(name, int(outs[name].data_ptr()))
        stream = torch.cuda.current_stream()
        if not ctx.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"TensorRT failed to run {self.path.name}")
        stream.synchronize()
        # TensorRT narrows int64 outputs (num_dets, classes) to int32: the host side reads int64
        return [outs[n].cpu().numpy().astype(np.int64) if outs[n].dtype == torch.int32 else outs[n].cpu().numpy()
                for n in self.output_names]

    def __repr__(self) -> str:
        shape = "dynamic" if self.dynamic else f"batch {self.batch}, {self.imgsz}x{self.imgsz}"
        return (f"TensorrtModel({self.FAMILY}-{self.size}, task={self.TASK}, nc={self.nc}, {shape}, {self.precision}, "
                f"file={self.path})")
