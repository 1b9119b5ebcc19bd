"""Promptable segmentation (``task="segment-prompt"``): masks for points and boxes (SAM's task).

Predict runs in two stages (:mod:`.predictor`): the image stage embeds an image once, the prompt
stage turns the embedding and one prompt (:mod:`.prompts`) into masks at the original image's
size with a predicted IoU per mask (``Results.masks``, :class:`~.results.PromptMasks`). Each stage
is a graph of its own: the image stage per input image size, the prompt stage per image size and
prompt count. No training: the families of this task ship trained (as the library it replaces).
"""
from __future__ import annotations

from typing import Any

import torch

from ..base import Task

#: the prompt ``libreyolo bench`` and the generic predict paths use for a family that takes points:
#: one foreground point at the image's centre (a box-only family, PicoSAM3, gets the centre box:
#: :func:`bench_prompt`)
BENCH_PROMPT = {"points": "center"}


def bench_prompt(model: Any = None) -> dict[str, str]:
    """The prompt of ``libreyolo bench``'s calls for ``model``: what its family takes (the centre
    point, or the centre box for a box-only family; :func:`.prompts.default_prompt`)."""
    from .prompts import default_prompt
    return dict(BENCH_PROMPT) if model is None else default_prompt(model)


class SegmentPromptTask(Task):
    name = "segment-prompt"
    primary_metric = "none"
    predict_defaults: dict = {"points": None, "labels": None, "boxes": None, "multimask": True,
                              "prompts": None, "points_per_side": 32, "points_per_batch": 64,
                              "pred_iou_thresh": 0.88, "stability_score_thresh": 0.95, "box_nms_thresh": 0.7,
                              "mask_input": None}

    def predictor(self, model):
        own = getattr(model, "prompt_predictor", None)   # a family whose stages differ (PicoSAM3)
        if own is not None:
            return own()
        from .predictor import PromptPredictor
        return PromptPredictor(model)

    def plan(self, model, size, constants, **opts):
        raise NotImplementedError("segment-prompt predicts in two stages (image, prompt): see "
                                  "libreyolo.tasks.segment_prompt.predictor.PromptPredictor")

    def resolve_data(self, data):
        raise NotImplementedError("training and validation are not implemented for segment-prompt models "
                                  "(MobileSAM ships trained)")

    # ---------------------------------------------------------- verification
    def verify_cases(self, model, size: int, batch: int, source_hw: tuple[int, int]) -> list[tuple]:
        """(name, fn, probe A, probe B) of the parity protocol: the network (embedding and a
        three-point decode), the image stage from uint8 images and the prompt stage (decoder and
        mask post-processing to ``source_hw``), each on ``batch`` images / prompts."""
        own = getattr(model, "verify_cases", None)
        if own is not None:   # a family whose stages differ (SAM 2, EdgeTAM: three maps, the video step; PicoSAM3)
            return own(size, batch, source_hw)
        from ...ops.preprocess import long_side_size
        from .predictor import PromptPredictor
        dev, net = model.device, model.model
        g = torch.Generator().manual_seed(2024)
        s = size // 16
        h, w = source_hw
        pts = lambda lo, hi: (lo + (hi - lo) * torch.rand((batch, 3, 2), generator=g)).to(dev)  # noqa: E731
        lab = torch.tensor([[1.0, 0.0, 1.0]]).expand(batch, 3).contiguous().to(dev)

        def network(x, p, lb):
            return net.decode(net.embed(x, size), p, lb, None, True, size)

        xa = (255 * torch.rand((batch, 3, size, size), generator=g)).to(dev)
        xb = (100 + 40 * torch.rand((batch, 3, size, size), generator=g)).to(dev)
        ua = torch.randint(0, 256, (batch, h, w, 3), generator=g, dtype=torch.uint8).to(dev)
        ub = torch.randint(90, 140, (batch, h, w, 3), generator=g, dtype=torch.uint8).to(dev)
        ea, eb = torch.randn((batch, 256, s, s), generator=g).to(dev), (2 * torch.rand((batch, 256, s, s), generator=g) - 1).to(dev)
        rh, rw = long_side_size(h, w, size)
        # packed rows in the frame: 2 points (x, y), their labels, 1 box
        def packed(lo, hi):
            p = lo + (hi - lo) * torch.rand((batch, 2, 2), generator=g)
            box = torch.cat([p.min(1).values, p.max(1).values], 1)
            return torch.cat([p.reshape(batch, 4), torch.tensor([[1.0, 0.0]]).expand(batch, 2), box], 1).to(dev)
        pred = PromptPredictor(model)
        stage = pred.prompt_stage(size, (rh, rw), (h, w), 2, 1, True)
        cases = [("network", network, (xa, pts(0, size), lab), (xb, pts(size / 4, size / 2), lab)),
                 (f"image-stage {h}x{w}->{size}", pred.encoder_stage(size), (ua,), (ub,)),
                 (f"prompt-stage {h}x{w}", stage, (ea, packed(0, min(rh, rw))), (eb, packed(10, min(rh, rw) / 2)))]
        from .predictor import low_res_side, takes_mask_prompts
        if takes_mask_prompts(model):   # SAM: the prompt stage with a mask prompt (low-resolution logits)
            with_mask = pred.prompt_stage(size, (rh, rw), (h, w), 2, 1, True, mask=True)
            s = low_res_side(size, int(model.STRIDE))
            ma = (20 * torch.rand((batch, 1, s, s), generator=g) - 10).to(dev)
            mb = torch.randn((batch, 1, s, s), generator=g).to(dev)
            cases.append((f"prompt-stage+mask {h}x{w}", with_mask, (ea, packed(0, min(rh, rw)), ma),
                          (eb, packed(10, min(rh, rw) / 2), mb)))
        return cases

    # ------------------------------------------------------------- benchmark
    def bench_options(self, model: Any = None) -> dict[str, Any]:
        """Predict options of the bench's end-to-end arms: one prompt per image, the one
        ``model``'s family takes (:func:`bench_prompt`)."""
        return bench_prompt(model)

    def bench_arms(self, model, image, runs: int, warmup: int, imgsz: int, time_call) -> dict[str, Any]:
        """The interactive case: ``set_image`` (the image stage) and a prompt call on the set
        image (uint8 image / prompt in, Results out), eager and with graphs; whether the graphed
        prompt call's masks and scores equal eager's; with graphs, each stage's replay alone."""
        dev = model.device
        arms: dict[str, Any] = {}
        graphs = [False] + ([True] if dev.type == "cuda" and model.SUPPORTS_CUDA_GRAPH else [])
        prompt = bench_prompt(model)
        out = {}
        for g in graphs:
            tag = "graph" if g else "eager"
            arms[f"set_image_{tag}"] = time_call(lambda: model.set_image(image, imgsz=imgsz, cuda_graph=g),
                                                 dev, runs, warmup)
            model.set_image(image, imgsz=imgsz, cuda_graph=g)
            arms[f"prompt_{tag}"] = time_call(lambda: model(**prompt, cuda_graph=g), dev, runs, warmup)
            out[tag] = model(**prompt, cuda_graph=g).masks
        if "graph" in out:
            arms["prompt_graph_equal_eager"] = bool(torch.equal(out["graph"].data, out["eager"].data)
                                                    and torch.equal(out["graph"].scores, out["eager"].scores))
            arms.update(self._stage_replays(model, image, imgsz, runs, warmup, time_call))
        return arms

    @staticmethod
    def _stage_replays(model, image, imgsz, runs, warmup, time_call) -> dict[str, Any]:
        """The two stages' graphs replayed alone (device inputs, no host work): where an
        end-to-end call's time goes."""
        from ...graphs.capture import CudaGraphCapturer
        from .prompts import pack, parse_prompt
        dev, pred = model.device, model.get_predictor()
        st = pred.current
        u8 = torch.from_numpy(image).to(dev)[None]
        p = parse_prompt(**bench_prompt(model)).for_image(*st.hw)
        packed = torch.from_numpy(pack(p, *st.hw, *st.resized)).to(dev)
        stage = pred.prompt_stage(st.size, st.resized, st.hw, len(p.points), len(p.boxes), True)
        arms = {}
        with torch.no_grad():
            g = CudaGraphCapturer().capture(pred.encoder_stage(imgsz), (u8,), module=model.model)
            arms["image_stage_graph_replay"] = time_call(lambda: g.replay((u8,), clone=False), dev, runs, warmup)
            g2 = CudaGraphCapturer().capture(stage, (st.embedding, packed), module=model.model)
            arms["prompt_stage_graph_replay"] = time_call(lambda: g2.replay((st.embedding, packed), clone=False),
                                                          dev, runs, warmup)
        return arms
