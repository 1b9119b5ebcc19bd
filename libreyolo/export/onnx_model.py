"""``LibreYOLO("model.onnx")``: an exported model run through onnxruntime behind the predict API.

:class:`OnnxModel` reads the metadata the exporter wrote (family, size, task, names, input size,
preprocessing, the detection graph's fixed options), resizes each image exactly as eager predict
does (``Preprocess.resize_images``, torch on the CPU), runs the graph in an onnxruntime session
(the CUDA execution provider when onnxruntime has it and the device allows, else the CPU one)
and builds the same :class:`~libreyolo.results.Results` as ``Model.predict``: the detection boxes
are mapped back to each image by the same numpy code; classification rows, semantic class maps,
pose candidates (the task's threshold and, for the dense families, its NMS) and the segment and
obb graphs' selected instances go through the task's own ``PredictPlan.results`` (segment: each
instance's mask logits sampled at the image's pixels, cut to its box, thresholded; obb: the
rotated boxes mapped back). For segment and obb the plan sees an :class:`_AfterSelection` view of
the model - no NMS left, the graph's mask logits in place of the prototypes.

What cannot change after export raises a clear error instead of silently differing: the input
size and batch of a static graph, ``max_det`` above the exported one, ``max_nms`` and
``agnostic_nms`` (baked into the detection, segment and obb graphs), ``topk`` above the exported
one; CUDA graphs (``cuda_graph=True``) and ``amp`` belong to the PyTorch engine, and training
needs the checkpoint.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..ops.preprocess import PAD_VALUE, Preprocess
from .onnx import META_FORMAT, RAW_TASKS, read_metadata, unreadable_onnx

log = logging.getLogger(__name__)

BACKEND = "onnxruntime"

#: onnxruntime's exception types for a model file it cannot parse or load
_UNREADABLE = ("InvalidProtobuf", "InvalidGraph", "NoModel")


class Ready:
    """A host tensor in the shape of the engine's HostCopy (``wait()`` gives it back)."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def wait(self) -> torch.Tensor:
        return self.t


def _providers(device: Any, available: list[str]) -> tuple[list, torch.device]:
    """onnxruntime execution providers for ``device`` ('auto', 'cpu', 'cuda', 'cuda:N', N)."""
    text = "auto" if device is None else str(device).strip().lower()
    if text.isdigit():
        text = f"cuda:{text}"
    has_cuda = "CUDAExecutionProvider" in available
    if text == "auto":
        text = "cuda" if has_cuda else "cpu"
    if text == "cpu":
        return ["CPUExecutionProvider"], torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        if not has_cuda:
            raise RuntimeError(f"device {device!r} was asked for, but this onnxruntime has no CUDAExecutionProvider "
                               f"(available: {', '.join(available)}); install onnxruntime-gpu or use device='cpu'")
        index = int(text.split(":", 1)[1]) if ":" in text else 0
        return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"], torch.device("cpu")
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a GPU index, got {device!r}")


#: tasks whose graph ends in the selected instances (thresholds, class mask, NMS, ``max_det`` rows)
SELECTING_TASKS = ("detect", "segment", "obb")


class _AfterSelection:
    """What a task's ``PredictPlan`` reads of its model, for the part of the stage the host runs
    after a graph that already selected the instances (segment, obb): the class names and the
    preprocessing (to map back to each image), no NMS left to run, and - segment - mask logits
    already assembled by the graph (``mask_logits(logits, rows)`` picks the kept rows), so that
    the segment task's own sampling at the image's pixels, box crop and threshold run unchanged."""

    NMS = False

    def __init__(self, model: OnnxModel):
        self.names, self.nc, self.preprocess = model.names, model.nc, model.preprocess

    @staticmethod
    def mask_logits(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return logits[rows]


class OnnxModel:
    """An ONNX file written by ``model.export(format="onnx")``, with ``Model``'s predict API.

    ``device``: 'auto' (onnxruntime's CUDA provider when present, else the CPU), 'cpu', 'cuda' or
    'cuda:N'. ``threads``: onnxruntime's intra-op threads (default: ``torch.get_num_threads()``,
    so one process setting - e.g. ``OMP_NUM_THREADS`` - governs both engines). Preprocessing runs
    in torch on the CPU (``device`` stays cpu); the graph runs where the providers say.
    """

    SUPPORTS_CUDA_GRAPH = False
    SUPPORTS_CUDA_GRAPH_TRAIN = False
    #: the runtime that runs the graph, and the kind of file, as the messages name them
    BACKEND = BACKEND
    KIND = "ONNX"
    #: whether predict tiles and blends a restore export (:class:`~.restore_model.OnnxRestoreModel`)
    TILES_RESTORE = False

    def __new__(cls, path: str | os.PathLike | None = None, *args: Any, **kwargs: Any):
        """``OnnxModel(path)`` of a task exported as two graphs (OCR, promptable segmentation) is
        that task's loader (:mod:`libreyolo.export.twostage`), chosen by the file's metadata."""
        if cls is OnnxModel and path is not None and Path(path).expanduser().is_file():
            try:
                meta = read_metadata(Path(path).expanduser())
            except ValueError:
                meta = {}   # an unreadable file: __init__ says so
            task = meta.get("task")
            from .twostage import LOADERS
            cls = LOADERS.get(task, cls)
            if "text" in json.loads(meta.get("parts") or "{}"):   # an image-text model's two towers (CLIP, SigLIP 2)
                from .embed_model import OnnxImageTextModel
                cls = OnnxImageTextModel
            elif task == "restore":   # the tile network: the restore task's tiling and blending around it
                from .restore_model import OnnxRestoreModel
                cls = OnnxRestoreModel
        return super().__new__(cls)

    def __init__(self, path: str | os.PathLike, device: Any = "auto", *, threads: int | None = None):
        try:
            import onnxruntime as ort
        except ImportError as exc:   # pragma: no cover - the test extra installs it
            raise ImportError("running .onnx models needs onnxruntime: pip install 'libreyolo-graphs[export]'") from exc
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"ONNX file {str(self.path)!r} not found")
        meta = read_metadata(self.path)
        if meta.get(META_FORMAT) is None:
            raise ValueError(f"{self.path} is an ONNX file but not a libreyolo export (its metadata_props have no "
                             f"'{META_FORMAT}' entry); export it with model.export(format='onnx')")
        self._ort = ort
        self._init_meta(meta, threads)
        self.to(device)

    def _init_meta(self, meta: dict[str, str], threads: int | None) -> None:
        """The model's attributes from the exporter's metadata (strings, as ``read_metadata`` gives them);
        shared with the runtimes that load the same graph (:mod:`libreyolo.export.openvino_model`)."""
        # the file's metadata, with the JSON entries the tasks read from a model's meta decoded
        # (pose: its skeleton)
        self.meta = {**meta, **{k: json.loads(meta[k]) for k in ("skeleton",) if k in meta}}
        self.FAMILY, self.size, self.TASK = meta["family"], meta["size"], meta["task"]
        self.nc = int(meta["nc"])
        self.names = {int(k): v for k, v in json.loads(meta["names"]).items()}
        self.imgsz, self.batch = int(meta["imgsz"]), int(meta["batch"])
        self.STRIDE = int(meta.get("stride", 32))
        self.dynamic, self.half = json.loads(meta["dynamic"]), json.loads(meta["half"])
        prep = json.loads(meta["preprocess"])
        # the default carries the file's padding level: from_meta keeps only the keys its default
        # writes, and a default at grey 114 leaves "pad" out (RT-DETRv2-OBB pads black)
        self.preprocess = Preprocess.from_meta(prep, Preprocess(pad=float(prep.get("pad", PAD_VALUE))))
        self.trained = json.loads(meta.get("trained", "true"))
        self.NMS = json.loads(meta.get("nms", "true"))
        self.max_det = int(meta.get("max_det", 0)) or None
        self.max_nms = int(meta.get("max_nms", 0)) or None
        self.agnostic_nms = json.loads(meta.get("agnostic_nms", "false"))
        self.topk = int(meta.get("topk", 0)) or None
        self.source = str(self.path)
        self.threads = threads

    # -------------------------------------------------------------------- plumbing
    @property
    def task(self) -> str:
        """The task's name as text (``TASK``)."""
        return self.TASK

    @property
    def task_def(self):
        """The task object (``libreyolo.tasks``) ``TASK`` names."""
        from ..tasks import get_task
        return get_task(self.TASK)

    @property
    def nb_classes(self) -> int:
        """The class count (``nc``), under the name the library this one replaces uses."""
        return self.nc

    def to(self, device: Any) -> OnnxModel:
        """(Re)open the session on ``device``'s execution providers."""
        self._providers, self.device = _providers(device, self._ort.get_available_providers())
        self.session = self._session(self.path)
        self.providers = self.session.get_providers()
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        return self

    def _session(self, path: Path):
        """An onnxruntime session of ``path`` on this model's providers and threads."""
        ort = self._ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(self.threads or torch.get_num_threads())
        opts.log_severity_level = 3   # onnxruntime's own warnings (e.g. unused initializers) are not ours
        try:
            return ort.InferenceSession(str(path), opts, providers=self._providers)
        except Exception as exc:   # a file onnx parses but onnxruntime cannot load (a corrupt graph)
            if type(exc).__name__ in _UNREADABLE or "Load model from" in str(exc):
                raise unreadable_onnx(path, exc) from exc
            raise   # e.g. an execution provider that fails to start: not the file's fault

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One run of the graph: its outputs in ``output_names`` order."""
        return self.session.run(None, feeds)

    def cpu(self) -> OnnxModel:
        return self.to("cpu")

    def __repr__(self) -> str:
        shape = "dynamic" if self.dynamic else f"batch {self.batch}, {self.imgsz}x{self.imgsz}"
        return (f"OnnxModel({self.FAMILY}-{self.size}, task={self.TASK}, nc={self.nc}, {shape}"
                f"{', fp16' if self.half else ''}, providers={self.providers}, file={self.path})")

    def info(self, verbose: bool = True) -> dict:
        """Family, task, input size, batch, providers and the graph's inputs and outputs."""
        d = {"family": self.FAMILY, "size": self.size, "task": self.TASK, "nc": self.nc, "imgsz": self.imgsz,
             "batch": self.batch, "dynamic": self.dynamic, "half": self.half, "backend": self.BACKEND,
             "providers": list(self.providers), "inputs": self.input_names, "outputs": self.output_names,
             "file": str(self.path)}
        if verbose:
            print(repr(self))
        return d

    def graph_info(self) -> dict:
        """No CUDA graphs here (the runtime runs the file); the shape of ``Model.graph_info()``."""
        return {"family": self.FAMILY, "backend": self.BACKEND, "mode": False, "graphs": [], "replays": 0,
                "fallbacks": [], "device": str(self.device)}

    def _no(self, what: str):
        raise NotImplementedError(f"{what} is not available for an {self.KIND} model ({self.path.name}, run by {self.BACKEND}): "
                                  "use the PyTorch checkpoint it was exported from")

    def train(self, **kwargs: Any):
        self._no("training")

    def val(self, *args: Any, **kwargs: Any):
        self._no("val()")

    def export(self, *args: Any, **kwargs: Any):
        self._no("export()")

    def capture_graph(self, *args: Any, **kwargs: Any):
        self._no("capture_graph() (CUDA graphs)")

    def fuse(self) -> OnnxModel:
        return self   # onnxruntime folds BatchNorm into convolutions when it opens the session

    # --------------------------------------------------------------------- predict
    def predict(self, source: Any, *, imgsz: int | None = None, batch: int | None = None, cuda_graph: Any = False,
                amp: Any = False, bgr: Any = None, color_format: Any = None, save: bool = False,
                save_dir: str | Path | None = None, exist_ok: bool = False, verbose: bool = False,
                strict: Any = False, **task_opts) -> Any:
        """Predict as :meth:`libreyolo.models.base.Model.predict` does, through onnxruntime (one
        image: one Results; several: a list).

        ``imgsz`` must be the exported size unless the graph is dynamic; ``batch`` (default: the
        exported batch, 1 for a dynamic graph) must be the exported one for a static graph (a last,
        shorter chunk is padded). ``cuda_graph=True`` and ``amp`` raise: they are the PyTorch
        engine's (``"auto"`` runs as False). The task's options are predict's. An unreadable file
        found in a directory or by a glob pattern is skipped with a warning naming it
        (``strict=True``: raise instead).
        """
        from ..data.sources import load_sources, parse_color
        from ..engine.paths import UniqueNames, next_run_dir, task_project
        from ..graphs.runner import normalize_mode
        from ..options import check_imgsz, check_int, parse_amp, parse_bool
        if normalize_mode(cuda_graph) is True:
            raise NotImplementedError(f"cuda_graph=True needs the PyTorch engine; {self.path.name} is an {self.KIND} model "
                                      f"run by {self.BACKEND} (use cuda_graph=False, or the .pt checkpoint)")
        if parse_amp(amp) is not None:
            raise NotImplementedError(f"amp is fixed when an {self.KIND} model is exported ({self.path.name}: "
                                      f"{'float16' if self.half else 'float32'}); export with half=True for float16")
        if self.TASK == "restore" and not self.TILES_RESTORE:   # the network on one batch of tiles (tasks/restore/export.py)
            raise NotImplementedError(f"{self.path.name} is a restore export: the network on a batch of "
                                      f"{self.imgsz}x{self.imgsz} tiles (input 'images' in [0, 1], output 'restored'); "
                                      f"{self.BACKEND} does not tile it here: load the .onnx file with LibreYOLO "
                                      "(onnxruntime, the restore task's tiling and blending), or predict with the .pt "
                                      "checkpoint")
        unknown = sorted(set(task_opts) - set(self.task_def.predict_defaults))
        if unknown:
            raise TypeError(f"unknown predict option(s) {', '.join(unknown)} for a {self.TASK} model; known: imgsz, "
                            "batch, cuda_graph, amp, bgr, color_format, save, save_dir, exist_ok, verbose, strict, "
                            + ", ".join(self.task_def.predict_defaults))
        size = check_imgsz(self.imgsz if imgsz is None else imgsz, self.STRIDE)
        if size != self.imgsz and not self.dynamic:
            raise ValueError(f"imgsz={size}, but {self.path.name} was exported at imgsz={self.imgsz} with a static "
                             f"shape; predict at {self.imgsz}, or export again with imgsz={size} or dynamic=True")
        if batch is None:
            batch = 1 if self.dynamic else self.batch
        batch = check_int("batch", batch, 1)
        if batch != self.batch and not self.dynamic:
            raise ValueError(f"batch={batch}, but {self.path.name} was exported with batch={self.batch} (static); "
                             f"predict with batch={self.batch}, or export again with batch={batch} or dynamic=True")
        save, bgr, strict = parse_bool("save", save), parse_color(bgr, color_format), parse_bool("strict", strict)
        # what the graph was exported with is the default (predict's own defaults may exceed it)
        if self.TASK in SELECTING_TASKS:
            task_opts.setdefault("max_det", self.max_det)
        elif self.TASK == "classify":
            task_opts.setdefault("topk", self.topk)
        # segment and obb: the graph ran the selection, the host the rest of the task's own stage
        plan = self.task_def.plan(_AfterSelection(self) if self.TASK in ("segment", "obb") else self, size, None,
                                  **task_opts)
        feeds = self._task_feeds(plan, task_opts)
        items = load_sources(source, bgr=bgr, strict=strict)
        out_dir = unique = None
        if save:
            out_dir = Path(save_dir) if save_dir else next_run_dir(task_project(self.TASK), "predict", exist_ok)
            out_dir.mkdir(parents=True, exist_ok=True)
            unique = UniqueNames()
        progress = None
        if verbose or len(items) > 32:
            from tqdm import tqdm
            progress = tqdm(total=len(items), desc=f"predict {self.FAMILY}-{self.size} ({self.KIND.lower()})", unit="img",
                            disable=not verbose and len(items) <= 32)
        results = []
        for start in range(0, len(items), batch):
            chunk = items[start:start + batch]
            t0 = time.perf_counter()
            x = self._inputs(chunk, size, batch)
            t1 = time.perf_counter()
            outs = self._run({"images": x, **feeds})
            t2 = time.perf_counter()
            speed = {"load": None, "preprocess": (t1 - t0) * 1e3 / len(chunk),
                     "inference": (t2 - t1) * 1e3 / len(chunk)}
            chunk_results = self._results(plan, dict(zip(self.output_names, outs)), chunk, size, speed)
            post = (time.perf_counter() - t2) * 1e3 / len(chunk)
            for r in chunk_results:
                r.speed["postprocess"] = post
                if out_dir is not None:
                    r.saved_to, r.save_dir = r.save(out_dir / unique(Path(r.path).stem)), str(out_dir)
            results.extend(chunk_results)
            if progress is not None:
                progress.update(len(chunk))
        if progress is not None:
            progress.close()
        if out_dir is not None and results:
            from ..logs import info_shown
            info_shown(log, "saved %d annotated image(s) to %s", len(results), out_dir)
        from ..data.sources import one_or_all
        return one_or_all(source, results)   # one image: one Results, as Model.predict

    __call__ = predict

    def _task_feeds(self, plan, task_opts: dict) -> dict[str, np.ndarray]:
        """The graph inputs besides the images (detection thresholds and class mask), after the
        checks of what the export fixed."""
        name = self.path.name
        if self.TASK == "classify":
            if plan.k > self.topk:
                raise ValueError(f"topk={plan.k}, but {name} was exported with topk={self.topk}; export again "
                                 f"with topk={plan.k}")
            return {}
        if self.TASK not in SELECTING_TASKS:
            return {}
        if plan.max_det > self.max_det:
            raise ValueError(f"max_det={plan.max_det}, but {name} was exported with max_det={self.max_det} (the "
                             f"graph's output rows); export again with max_det={plan.max_det}")
        if "max_nms" in task_opts and plan.max_nms != self.max_nms:
            raise ValueError(f"max_nms={plan.max_nms}, but {name} was exported with max_nms={self.max_nms} (fixed in "
                             "the graph); export again with that max_nms")
        if "agnostic_nms" in task_opts and plan.agnostic != self.agnostic_nms:
            raise ValueError(f"agnostic_nms={plan.agnostic}, but {name} was exported with "
                             f"agnostic_nms={self.agnostic_nms} (fixed in the graph); export again with that value")
        mask = np.ones(self.nc, np.float32)
        if plan.classes is not None:
            mask[:] = 0
            mask[np.asarray(plan.classes, np.int64)] = 1
        feeds = {"conf_threshold": np.array([plan.conf], np.float32), "iou_threshold": np.array([plan.iou], np.float32),
                 "class_mask": mask}
        return {k: v for k, v in feeds.items() if k in self.input_names}

    def _inputs(self, chunk, size: int, batch: int) -> np.ndarray:
        """The chunk's images resized as eager predict resizes them (float32 NCHW in [0, 1]),
        padded with zero images to a static graph's batch."""
        images = [torch.as_tensor(it.image).cpu() for it in chunk]
        prep = self.preprocess
        if len({tuple(im.shape) for im in images}) == 1:   # one call for the batch, as the predictor does
            x = prep.resize_images(torch.stack(images), size)
        else:
            x = torch.cat([prep.resize_images(im.unsqueeze(0), size) for im in images])
        if not self.dynamic and tuple(x.shape[-2:]) != (self.imgsz, self.imgsz):
            # an aspect-keeping resize (depth's "cover", OCR's "limit") of a non-square image
            raise ValueError(f"{self.path.name} was exported static at {self.imgsz}x{self.imgsz}, but this model "
                             f"resizes keeping the aspect ratio ({prep.resize!r}) and this image's input is "
                             f"{x.shape[-2]}x{x.shape[-1]}; predict square images, or export with dynamic=True "
                             "where the family holds it (docs/export.md)")
        if not self.dynamic and x.shape[0] < batch:
            x = torch.cat((x, x.new_zeros((batch - x.shape[0], *x.shape[1:]))))
        return x.numpy()

    def _results(self, plan, out: dict[str, np.ndarray], chunk, size: int, speed: dict) -> list:
        n = len(chunk)
        if self.TASK == "detect":
            return self._detections(plan, out["dets"][:n], out["num_dets"][:n], chunk, size, speed)
        if self.TASK in ("segment", "obb"):
            # the graph's rows, those past each image's count scored -inf (no threshold keeps them)
            dets = torch.from_numpy(np.array(out["dets"][:n], dtype=np.float32))
            counts = torch.from_numpy(np.asarray(out["num_dets"][:n], dtype=np.int64))
            rows = torch.arange(dets.shape[1])
            scores = dets[..., -2].masked_fill(rows >= counts[:, None], float("-inf"))
            cls = dets[..., -1].to(torch.int64)
            if self.TASK == "obb":
                return plan.results((dets[..., :5], scores, cls), chunk, size, speed)
            # the kept rows' mask logits stand for the prototypes, their row numbers for the
            # coefficients: _AfterSelection.mask_logits picks them
            logits = torch.from_numpy(np.ascontiguousarray(out["mask_logits"][:n]))
            return plan.results((dets[..., :4], scores, cls, rows.expand(n, -1), logits), chunk, size, speed)
        if self.TASK == "classify":
            k = plan.k
            packed = torch.cat((torch.from_numpy(out["probs"][:n]), torch.from_numpy(out["top_conf"][:n, :k]),
                                torch.from_numpy(out["top_class"][:n, :k]).float()), 1)
            return plan.results(Ready(packed), chunk, size, speed)
        if self.TASK in RAW_TASKS:   # the network's outputs: the rest of the stage as eager predict runs it
            raw = tuple(torch.from_numpy(np.ascontiguousarray(out[name][:n])) for name in self.output_names)
            return plan.results(plan.finish(raw[0] if len(raw) == 1 else raw), chunk, size, speed)
        return plan.results(torch.from_numpy(np.ascontiguousarray(out["class_map"][:n])), chunk, size, speed)

    def _detections(self, plan, dets: np.ndarray, counts: np.ndarray, chunk, size: int, speed: dict) -> list:
        """Canvas detections -> each image's pixels (the host path of eager predict)."""
        from ..ops.letterbox import inverse_params, unletterbox_boxes
        from ..results import Boxes, Results
        results = []
        for i, it in enumerate(chunk):
            d = np.ascontiguousarray(dets[i, :min(int(counts[i]), plan.max_det)], dtype=np.float32).copy()
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            sx, sy, px, py = inverse_params(h, w, size, self.preprocess.resize)
            unletterbox_boxes(d, sx, sy, h, w, px, py)
            results.append(Results(it.image, it.name, self.names, Boxes(torch.from_numpy(d), (h, w)),
                                   speed=dict(speed)))
        return results
