"""Where a MobileSAM prompt call's device time goes: the prompt stage's graph and its parts.

    PYTHONPATH=. python3 scripts/sam_prompt_profile.py [--size tiny] [--imgsz 1024] [--out DIR]

Sets the 1280x720 sample as the image, then times (CUDA events, medians of 200 replays) the
graphs of: the whole prompt stage (prompt encoder, mask decoder, SAM's post-processing), the
decoder alone (low-resolution logits) and the post-processing alone; and profiles 20 replays of
the whole stage (kernels by device time, their count per replay) into DIR/prompt_kernels.txt.
``--split-keys 0,128,256`` also times the whole stage with each ``Attention.SPLIT_KEYS`` (0: one
matmul), the landed value last.
"""
import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.benchmark import event_time_call
from libreyolo.data.sources import load_sources
from libreyolo.graphs.capture import CudaGraphCapturer
from libreyolo.models.mobilesam.nn import Attention
from libreyolo.tasks.segment_prompt.predictor import postprocess_masks
from libreyolo.tasks.segment_prompt.prompts import pack, parse_prompt, unpack
from libreyolo.tasks.segment_prompt.task import BENCH_PROMPT


def replay_ms(g, args, runs=200, warmup=30) -> float:
    return event_time_call(lambda: g.replay(args, clone=False), runs, warmup)["median_ms"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--imgsz", type=int, default=1024)
    ap.add_argument("--out", default="runs/sam_prompt")
    ap.add_argument("--split-keys", default="")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = LibreYOLO(f"mobilesam-{a.size}")
    image = load_sources(SAMPLE_IMAGE)[0].image
    model.set_image(image, imgsz=a.imgsz, cuda_graph=True)
    pred = model.get_predictor()
    st = pred.current
    p = parse_prompt(**BENCH_PROMPT).for_image(*st.hw)
    n_p, n_b = len(p.points), len(p.boxes)
    packed = torch.from_numpy(pack(p, *st.hw, *st.resized)).to(model.device)
    whole = pred.prompt_stage(st.size, st.resized, st.hw, n_p, n_b, True)

    def decoder(emb, pk):
        pts, lab, boxes = unpack(pk, n_p, n_b)
        return model.decode(emb, pts, lab, boxes, True, st.size)

    res = {"prompt": BENCH_PROMPT, "hw": st.hw, "resized": st.resized, "frame": st.size,
           "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    landed = Attention.SPLIT_KEYS
    with torch.no_grad():
        Attention.SPLIT_KEYS = None
        one_matmul = decoder(st.embedding, packed)[0]
        for run in [int(v) for v in a.split_keys.split(",") if v]:
            Attention.SPLIT_KEYS = run or None
            g = CudaGraphCapturer().capture(whole, (st.embedding, packed), module=model.model)
            res[f"whole_stage_ms_split_{run}"] = replay_ms(g, (st.embedding, packed))
            # the low-resolution logits' largest change against one matmul (eager)
            res[f"logits_max_diff_split_{run}"] = float((decoder(st.embedding, packed)[0] - one_matmul).abs().max())
            del g
        Attention.SPLIT_KEYS = landed
        res["split_keys"] = landed
        low, _ = decoder(st.embedding, packed)
        cap = CudaGraphCapturer()
        g_whole = cap.capture(whole, (st.embedding, packed), module=model.model)
        g_dec = CudaGraphCapturer().capture(decoder, (st.embedding, packed), module=model.model)
        g_post = CudaGraphCapturer().capture(lambda x: postprocess_masks(x, st.size, st.resized, st.hw), (low,),
                                             module=model.model)
        res["whole_stage_ms"] = replay_ms(g_whole, (st.embedding, packed))
        res["decoder_ms"] = replay_ms(g_dec, (st.embedding, packed))
        res["postprocess_ms"] = replay_ms(g_post, (low,))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                g_whole.replay((st.embedding, packed), clone=False)
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    res["kernels_per_replay"] = len(kernels) / 20
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    (out / "prompt_kernels.txt").write_text(table)
    (out / "prompt.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    print(table)


if __name__ == "__main__":
    main()
