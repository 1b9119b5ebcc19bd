"""Video sources through PyAV: round trips, vid_stride, saving, .streams lists, errors, graphs.

Every clip is generated here (small frames, few of them) and every network source is on the
loopback interface: a port that accepts and never answers, a port with nothing listening, and
a one-shot HTTP server that sends part of a clip and hangs up.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from standin import StandInCapturer

from libreyolo import LibreYOLO
from libreyolo.data.clips import moving_shapes, write_moving_shapes_clip
from libreyolo.data.video import VideoSourceError, VideoWriter, is_video_source, open_video_sources

W, H, FPS = 96, 64, 25


@pytest.fixture(scope="module")
def model():
    return LibreYOLO.new("yolo9", "t", device="cpu", seed=0)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clips") / "clip.mp4"
    write_moving_shapes_clip(path, W, H, frames=12, fps=FPS, objects=2, seed=1)
    return path


def write_with(path, codec, frames=6, fmt=None, pix_fmt="yuv420p"):
    """A clip through PyAV directly (another encoder/container than VideoWriter's)."""
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=FPS)
        s.width, s.height, s.pix_fmt = W, H, pix_fmt
        for image, _ in moving_shapes(W, H, frames, objects=1, seed=0):
            for p in s.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def probe(path):
    with av.open(str(path)) as c:
        v = c.streams.video[0]
        n = sum(1 for _ in c.decode(v))
        return v.average_rate, (v.codec_context.width, v.codec_context.height), n


# ---- sources --------------------------------------------------------------------------------------


def test_what_counts_as_video():
    for s in ("a.mp4", "b.MKV", "c.avi", "d.mov", "e.webm", "cams.streams", "list.txt", 0, 3, "0",
              "rtsp://127.0.0.1/x", "rtmp://h/a", "http://h/v.ts", "https://h/v", "/dev/video0"):
        assert is_video_source(s), s
    for s in ("a.jpg", "dir/", "*.png", True, 1.5, [0], np.zeros((2, 2, 3), np.uint8)):
        assert not is_video_source(s), s


@pytest.mark.parametrize("ext,codec", [("mp4", "libx264"), ("mkv", "libx264"), ("avi", "mpeg4"),
                                       ("mov", "libx264"), ("webm", "libvpx-vp9")])
def test_each_container_decodes_with_indices_and_times(tmp_path, ext, codec):
    path = write_with(tmp_path / f"c.{ext}", codec)
    with open_video_sources(path) as vs:
        (s,) = vs.streams
        assert (s.width, s.height, s.fps) == (W, H, FPS)
        frames = [f for step in vs.steps() for f in step]
    assert [f.index for f in frames] == list(range(6))
    np.testing.assert_allclose([f.timestamp for f in frames], np.arange(6) / FPS, atol=1e-6)
    assert all(f.image.shape == (H, W, 3) and f.image.dtype == np.uint8 for f in frames)


def test_frames_match_what_was_written(tmp_path):
    """Decoded RGB is close to the rendered frames (lossy codec: a small mean error)."""
    path = tmp_path / "c.mp4"
    write_moving_shapes_clip(path, W, H, frames=4, fps=FPS, objects=2, seed=3)
    with open_video_sources(path) as vs:
        got = [f.image for step in vs.steps() for f in step]
    want = [im for im, _ in moving_shapes(W, H, 4, objects=2, seed=3)]
    assert len(got) == 4
    for g, w in zip(got, want):
        assert np.abs(g.astype(int) - w).mean() < 6


# ---- predict on a video ---------------------------------------------------------------------------


def test_stream_is_a_generator_list_is_a_list_same_results(model, clip):
    gen = model.predict(clip, imgsz=64, stream=True, conf=0.0)
    assert iter(gen) is gen and not isinstance(gen, list)
    streamed = list(gen)
    listed = model.predict(clip, imgsz=64, conf=0.0)
    assert isinstance(listed, list) and len(listed) == len(streamed) == 12
    for a, b in zip(streamed, listed):
        assert torch.equal(a.boxes.data, b.boxes.data)
    assert [r.frame_index for r in listed] == list(range(12))
    np.testing.assert_allclose([r.timestamp for r in listed], np.arange(12) / FPS, atol=1e-6)
    assert {r.path for r in listed} == {str(clip)} and {r.stream for r in listed} == {0}


def test_stream_holds_no_past_frames(model, clip):
    """Constant memory: once the consumer lets go of a frame's Results, nothing keeps it alive
    (freed by reference counting: no cycle holds it either)."""
    import weakref
    refs, alive = [], []
    for r in model.predict(clip, imgsz=64, stream=True, vid_stride=2):
        refs.append(weakref.ref(r))
        del r
        alive.append(sum(ref() is not None for ref in refs[:-1]))
    assert len(refs) == 6 and max(alive) == 0


def test_batch_of_frames_gives_the_same_results(model, clip):
    one = model.predict(clip, imgsz=64, conf=0.0)
    four = model.predict(clip, imgsz=64, conf=0.0, batch=4)
    assert [r.frame_index for r in four] == list(range(12))
    for a, b in zip(one, four):
        torch.testing.assert_close(a.boxes.data, b.boxes.data, atol=1e-3, rtol=1e-4)


def test_vid_stride_and_saved_video(model, clip, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        rs = list(model.predict(clip, imgsz=64, stream=True, vid_stride=3, save=True, save_dir=tmp_path / "run"))
    assert [r.frame_index for r in rs] == [0, 3, 6, 9]
    np.testing.assert_allclose([r.timestamp for r in rs], [0, 3 / FPS, 6 / FPS, 9 / FPS], atol=1e-6)
    out = tmp_path / "run" / "clip.mp4"
    assert {r.saved_to for r in rs} == {str(out)}
    rate, size, n = probe(out)
    assert (rate, size, n) == (Fraction(FPS, 3), (W, H), 4)  # the source's duration is kept
    assert any("libx264" in m or "mpeg4" in m for m in caplog.messages)  # which encoder, said once


def test_saved_video_same_fps_size_and_count(model, clip, tmp_path):
    rs = model.predict(clip, imgsz=64, save=True, save_dir=tmp_path)
    assert probe(tmp_path / "clip.mp4") == (Fraction(FPS), (W, H), len(rs))
    # the annotated frames are what was written (lossy codec: close, not equal)
    with open_video_sources(tmp_path / "clip.mp4") as vs:
        written = [f.image for step in vs.steps() for f in step]
    assert np.abs(written[5].astype(int) - rs[5].plot()).mean() < 6


def test_odd_frame_size_is_kept(tmp_path):
    w = VideoWriter(tmp_path / "odd.mp4", 10, 33, 21)
    for image, _ in moving_shapes(33 * 2, 21 * 2, 3, objects=1):
        w.write(np.ascontiguousarray(image[:21, :33]))
    w.close()
    assert probe(tmp_path / "odd.mp4") == (Fraction(10), (33, 21), 3)


def test_a_failed_video_write_names_the_video_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """A read-only folder or a full disk fails the writer's last steps: the error names the video
    asked for, not the hidden temp file, and the temp file is gone."""
    import errno

    from libreyolo.data import video as V

    def read_only(src, dst):
        raise OSError(errno.EROFS, "Read-only file system", str(src))

    w = VideoWriter(tmp_path / "out.mp4", 10, 32, 24)
    w.write(np.zeros((24, 32, 3), np.uint8))
    monkeypatch.setattr(V.os, "replace", read_only)
    with pytest.raises(OSError) as info:
        w.close()
    text = str(info.value)
    assert text.startswith(f"cannot save the video '{tmp_path / 'out.mp4'}'") and ".tmp" not in text
    assert info.value.errno == errno.EROFS and list(tmp_path.iterdir()) == []


def test_stopping_early_keeps_what_was_written(model, clip, tmp_path):
    gen = model.predict(clip, imgsz=64, stream=True, save=True, save_dir=tmp_path)
    for _ in range(3):
        next(gen)
    gen.close()  # the consumer stops: reader and writer are closed, the video holds 3 frames
    assert probe(tmp_path / "clip.mp4")[2] == 3


def test_stream_list_batches_one_result_per_stream(model, tmp_path):
    write_moving_shapes_clip(tmp_path / "a.mp4", W, H, frames=5, fps=FPS, objects=1, seed=0)
    write_moving_shapes_clip(tmp_path / "b.mkv", 80, 48, frames=3, fps=10, objects=1, seed=1)
    lst = tmp_path / "two.streams"
    lst.write_text("# two clips\na.mp4\n\n" + str(tmp_path / "b.mkv") + "\n")
    rs = list(model.predict(lst, imgsz=64, stream=True, save=True, save_dir=tmp_path / "run"))
    assert [(r.stream, r.frame_index) for r in rs] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
                                                       (0, 3), (0, 4)]
    assert {r.path for r in rs if r.stream == 1} == {str(tmp_path / "b.mkv")}
    assert rs[1].orig_shape == (48, 80)
    assert probe(tmp_path / "run" / "a.mp4") == (Fraction(FPS), (W, H), 5)
    assert probe(tmp_path / "run" / "b.mp4") == (Fraction(10), (80, 48), 3)


def test_stream_list_errors_name_the_line(tmp_path):
    lst = tmp_path / "cams.txt"
    lst.write_text("a.mp4\nphoto.jpg\n")
    with pytest.raises(VideoSourceError, match=r"line 2: 'photo.jpg' is not a video"):
        open_video_sources(lst)
    lst.write_text("# nothing\n\n")
    with pytest.raises(VideoSourceError, match="names no source"):
        open_video_sources(lst)


def test_show_without_display_warns_once(model, clip, monkeypatch, caplog):
    import libreyolo.engine.predict_video as predict_video
    monkeypatch.setattr(predict_video, "_warned_no_window", False)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        model.predict(clip, imgsz=64, show=True, vid_stride=4)
    msgs = [m for m in caplog.messages if "show=True" in m]
    assert len(msgs) == 1 and "no display" in msgs[0] and "save=True" in msgs[0]


def test_video_frames_capture_the_uint8_stage_at_the_second_frame(clip):
    """cuda_graph='auto' on a video: one capture (the whole uint8 stage) at frame 2, replays after,
    same numbers as eager. Driven on the CPU through a stand-in capturer (the policy; the real
    capture is proved on the GPU)."""
    m = LibreYOLO.new("yolo9", "t", device="cpu", seed=0)
    cap = m.runner.capturer = StandInCapturer()
    eager = m.predict(clip, imgsz=64, conf=0.0)
    gen = m.predict(clip, imgsz=64, conf=0.0, cuda_graph="auto", stream=True)
    got, captured_at = [], []
    for r in gen:
        got.append(r)
        captured_at.append(len(cap.captures))
    assert captured_at[:3] == [0, 1, 1] and captured_at[-1] == 1
    assert cap.captures[0][0] == (1, H, W, 3)  # the raw uint8 frame: preprocessing is inside the graph
    info = m.graph_info()
    assert "u8" in info["graphs"][0]["stage"] and info["replays"] == len(got) - 1  # frames 2.. from the graph
    for a, b in zip(eager, got):
        assert torch.equal(a.boxes.data, b.boxes.data)





# ---- errors ---------------------------------------------------------------------------------------


def test_corrupt_truncated_and_non_video_files_fail_at_the_call(model, clip, tmp_path):
    data = clip.read_bytes()
    (tmp_path / "junk.mp4").write_bytes(np.random.default_rng(0).bytes(4000))
    (tmp_path / "half.mp4").write_bytes(data[: len(data) // 2])  # no moov atom: undecodable
    (tmp_path / "notes.mkv").write_text("not a video at all")
    with av.open(str(tmp_path / "sound.mkv"), "w") as c:  # audio only
        s = c.add_stream("pcm_s16le", rate=8000)
        fr = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        fr.sample_rate = 8000
        for p in s.encode(fr):
            c.mux(p)
    # a codec no decoder knows: an mpeg4 AVI whose codec tag is overwritten
    avi = write_with(tmp_path / "odd.avi", "mpeg4").read_bytes()
    assert b"FMP4" in avi
    (tmp_path / "codec.avi").write_bytes(avi.replace(b"FMP4", b"QQZZ"))
    for name, match in (("junk.mp4", "corrupt or truncated"), ("half.mp4", "corrupt or truncated"),
                        ("notes.mkv", "corrupt or truncated"), ("sound.mkv", "no video stream"),
                        ("codec.avi", "unsupported codec")):
        path = tmp_path / name
        with pytest.raises(VideoSourceError, match=match) as e:
            model.predict(path, imgsz=64, stream=True)  # raised by the call, not by the first next()
        assert str(path) in str(e.value)
    with pytest.raises(FileNotFoundError, match="missing.mp4"):
        model.predict(tmp_path / "missing.mp4", imgsz=64)


def test_corrupt_data_mid_file_names_the_file_and_frame(model, tmp_path):
    path = write_with(tmp_path / "c.mkv", "libx264", frames=10)
    b = bytearray(path.read_bytes())
    b[600:1500] = np.random.default_rng(0).integers(0, 256, 900, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(b))
    with pytest.raises(VideoSourceError, match=r"c\.mkv' at frame \d+: the file is corrupt"):
        list(model.predict(path, imgsz=64, stream=True))


def test_truncated_mkv_keeps_its_frames_and_warns(model, tmp_path, caplog):
    path = write_with(tmp_path / "c.mkv", "libx264", frames=20)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.9)])
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        rs = model.predict(path, imgsz=64)
    assert 0 < len(rs) < 20
    assert any("looks truncated" in m and "c.mkv" in m for m in caplog.messages)


def test_camera_that_does_not_open(model):
    with pytest.raises(VideoSourceError, match="camera 97 does not open"):
        model.predict(97, imgsz=64)


@pytest.fixture
def silent_port():
    """A loopback port that accepts connections and never says anything."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []

    def accept():
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
    for c in held:
        c.close()


@pytest.mark.parametrize("scheme", ["http", "rtsp"])
def test_url_that_does_not_answer_times_out(model, silent_port, scheme):
    url = f"{scheme}://127.0.0.1:{silent_port}/live"
    t0 = time.monotonic()
    with pytest.raises(VideoSourceError, match=r"did not answer within 0\.5 s") as e:
        model.predict(url, imgsz=64, timeout=0.5, stream=True)
    assert url in str(e.value) and time.monotonic() - t0 < 5


def test_url_with_nothing_listening(model):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(VideoSourceError, match="refused the connection"):
        model.predict(f"http://127.0.0.1:{port}/x.ts", imgsz=64, timeout=1)


def serve_once(payload: bytes, stall: float = 0.0) -> int:
    """A one-shot loopback HTTP server: answers one request with ``payload`` (no length given),
    optionally waits ``stall`` seconds, then hangs up. Returns its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(10)

    def run():
        try:
            c, _ = srv.accept()
            c.recv(4096)
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: video/mp2t\r\n\r\n" + payload)
            time.sleep(stall)
            c.close()
        except OSError:
            pass
        finally:
            srv.close()
    threading.Thread(target=run, daemon=True).start()
    return srv.getsockname()[1]


@pytest.fixture(scope="module")
def ts_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("ts") / "live.ts"
    with av.open(str(path), "w", format="mpegts") as c:
        s = c.add_stream("libx264", rate=FPS, options={"g": "5"})
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        for image, _ in moving_shapes(W, H, 30, objects=1):
            for p in s.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path.read_bytes()


@pytest.mark.parametrize("stall,why", [(0.0, "Input/output error"), (8.0, "sent nothing for 1 s")])
def test_stream_that_drops_mid_way_ends_cleanly(model, ts_bytes, caplog, stall, why):
    """Half a stream, then the server hangs up (or goes silent past the read timeout): the frames
    received come out, then the generator ends with a warning - no exception."""
    port = serve_once(ts_bytes[: len(ts_bytes) // 2], stall=stall)
    url = f"http://127.0.0.1:{port}/live.ts"
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        rs = list(model.predict(url, imgsz=64, stream=True, timeout=1.0))
    assert 0 < len(rs) < 30
    assert [r.frame_index for r in rs] == list(range(len(rs)))  # HTTP never drops frames
    assert any(url in m and why in m and "frames already delivered are kept" in m for m in caplog.messages)


# ---- command line ---------------------------------------------------------------------------------


def test_cli_predict_track_and_bench_on_a_clip(clip, tmp_path, capsys):
    from libreyolo.cli import main
    rc = main(["predict", "model=yolo9t", f"source={clip}", "imgsz=64", "vid_stride=4", f"save_dir={tmp_path / 'p'}",
               f"json={tmp_path / 'p.json'}"])
    out = capsys.readouterr().out
    assert rc == 0 and "3 frame(s)" in out and (tmp_path / "p" / "clip.mp4").is_file()
    import json
    rows = json.loads((tmp_path / "p.json").read_text())
    assert [r["frame"] for r in rows] == [0, 4, 8]
    rc = main(["track", "model=yolo9t", f"source={clip}", "imgsz=64", "vid_stride=6", "tracker=botsort",
               f"save_dir={tmp_path / 't'}"])
    assert rc == 0 and "track(s)" in capsys.readouterr().out and (tmp_path / "t" / "clip.mp4").is_file()
    rc = main(["bench", "model=yolo9t", f"source={clip}", "imgsz=64", "frames=3", "warmup=1", "device=cpu",
               f"json={tmp_path / 'b.json'}"])
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "b.json").read_text())
    assert rc == 0 and "graph arms skipped: needs a CUDA device" in out
    assert set(res["arms"]) == {"decode", "predict_eager", "video_eager"}
    assert res["arms"]["decode"]["frames"] == 3 and res["arms"]["video_eager"]["frames"] == 3
