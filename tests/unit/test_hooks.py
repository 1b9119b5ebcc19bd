"""The trainer's hooks (CPU): a user's hook sees every event in order, ``add_callback`` and
``callbacks={event: fn}`` call functions with the trainer, an unknown event is refused naming the
known ones, and a hook that raises stops the run with one error naming it - after the run's normal
end (the checkpoint write finished, the run folder's lock released)."""
import multiprocessing

import pytest

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine.hooks import EVENTS, CallbackHook, HookBase, HookError
from libreyolo.engine.runs import RunLock
from libreyolo.weights import load_checkpoint


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("hooks") / "ds", n_train=8, n_val=4, imgsz=64, seed=0))


def model():
    return LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)


def args(data, tmp_path, **kw):
    return dict(data=data, epochs=2, batch=4, imgsz=64, workers=0, project=str(tmp_path), name="run",
                close_mosaic=0, warmup_epochs=1, verbose=False, plots=False, seed=0, nbs=4, **kw)


class Recorder(HookBase):
    """Every event, with what the trainer says at it."""

    def __init__(self):
        self.seen = []

    def before_train(self):
        self.seen.append(("before_train", self.trainer.start_epoch))

    def before_epoch(self):
        self.seen.append(("before_epoch", self.trainer.epoch))

    def before_step(self):
        self.seen.append(("before_step", self.trainer.iter))

    def after_step(self):
        self.seen.append(("after_step", self.trainer.iter, tuple(self.trainer.step_items.shape)))

    def after_epoch(self):
        state = self.trainer.epoch_state
        self.seen.append(("after_epoch", state["epoch"], "metrics" in state, len(self.trainer.history)))

    def after_train(self):
        self.seen.append(("after_train", len(self.trainer.history)))


def test_a_user_hook_receives_every_event_in_order(data, tmp_path):
    rec = Recorder()
    res = model().train(callbacks=[rec], **args(data, tmp_path))
    n = len(res["loss_names"])
    expected = [("before_train", 0)]
    for epoch in range(2):   # 8 images, batch 4: two steps per epoch
        expected.append(("before_epoch", epoch))
        for ni in (2 * epoch, 2 * epoch + 1):
            expected += [("before_step", ni), ("after_step", ni, (n,))]
        expected.append(("after_epoch", epoch, True, epoch + 1))   # after the logs: its row is in history
    expected.append(("after_train", 2))
    assert rec.seen == expected


def test_add_callback_and_a_callbacks_dict_call_functions_with_the_trainer(data, tmp_path):
    m = model()
    epochs, starts = [], []
    m.add_callback("after_epoch", lambda t: epochs.append((t.epoch, t.epoch_state["metrics"] is not None)))
    res = m.train(callbacks={"before_train": lambda t: starts.append(t.cfg.run.epochs)}, **args(data, tmp_path))
    assert epochs == [(0, True), (1, True)] and starts == [2] and res["epochs"] == 2
    # the model keeps its callbacks for its next run; a dict's are for that run only
    m.train(**args(data, tmp_path, exist_ok=True))
    assert epochs[2:] == [(0, True), (1, True)] and starts == [2]


def test_unknown_events_are_refused_naming_the_known_ones(data, tmp_path):
    with pytest.raises(ValueError, match=r"unknown training event 'on_fit_epoch_end'; the events are "
                                         r"before_train, before_epoch, before_step, after_step, after_epoch, after_train"):
        model().add_callback("on_fit_epoch_end", print)
    with pytest.raises(ValueError, match="unknown training event 'after_batch'"):
        model().train(callbacks={"after_batch": print}, **args(data, tmp_path))
    with pytest.raises(TypeError, match="must be callable"):
        model().add_callback("after_epoch", "print")
    assert not (tmp_path / "run").exists()   # refused before any work


def test_per_step_events_are_called_only_for_hooks_that_handle_them():
    class EpochOnly(HookBase):
        def after_epoch(self):
            pass

    assert [e for e in EVENTS if EpochOnly().handles(e)] == ["after_epoch"]
    assert [e for e in EVENTS if HookBase().handles(e)] == []
    assert [e for e in EVENTS if CallbackHook({"after_step": print}).handles(e)] == ["after_step"]


def test_a_raising_hook_stops_the_run_with_one_error_naming_it_after_the_normal_end(data, tmp_path):
    class Boom(HookBase):
        def after_epoch(self):
            raise ValueError("boom")

    with pytest.raises(HookError) as info:
        model().train(callbacks=[Boom()], **args(data, tmp_path))
    assert str(info.value) == "training stopped: the hook Boom raised in after_epoch: ValueError: boom"
    assert isinstance(info.value.__cause__, ValueError)
    run = tmp_path / "run"
    assert not (run / RunLock.NAME).exists()   # the run folder's lock released
    # the epoch's checkpoint write (submitted before the hook ran) was finished, whole
    assert load_checkpoint(run / "weights" / "last.pt")["train_state"]["epoch"] == 0
    # a function's name is the hook's; a second run into the folder is not refused (no lock left);
    # the loader's workers (and validation's, started before the epoch's last step) are gone
    before = set(multiprocessing.active_children())

    def fails_at_step(t):
        if t.iter == 1:
            raise RuntimeError("at step 1")
    with pytest.raises(HookError, match=r"the hook callback .*fails_at_step raised in before_step: "
                                        r"RuntimeError: at step 1"):
        model().train(callbacks={"before_step": fails_at_step}, **{**args(data, tmp_path, exist_ok=True), "workers": 1})
    assert not (run / RunLock.NAME).exists()
    assert set(multiprocessing.active_children()) <= before
