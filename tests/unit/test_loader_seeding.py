"""Persistent DataLoader workers re-seeded per epoch (EpochSeeded): epoch e's augmentation draws do
not depend on the epochs a worker ran before, so a resumed run augments as an uninterrupted one."""
import numpy as np
import torch

from libreyolo.engine.loaders import EpochSeeded, default_workers


class Draws(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([float(i), float(torch.rand(())), float(np.random.rand())])


def _epochs(start, stop, seed=0):
    ds = EpochSeeded(Draws(), seed)
    gen = torch.Generator()
    loader = torch.utils.data.DataLoader(ds, batch_size=2, shuffle=True, generator=gen, num_workers=2,
                                         persistent_workers=True)
    out = {}
    for epoch in range(start, stop):
        gen.manual_seed(seed + epoch)
        if epoch > start:   # as Trainer.train_epoch does for a persistent loader
            torch.empty((), dtype=torch.int64).random_(generator=gen)
        ds.set_epoch(epoch)
        out[epoch] = torch.cat(list(loader))
    return out


def test_persistent_workers_draw_per_epoch_as_a_fresh_start():
    straight = _epochs(0, 3)
    resumed = _epochs(2, 3)
    assert torch.equal(straight[2], resumed[2])
    assert not torch.equal(straight[1][:, 1:], straight[2][:, 1:])   # epochs differ


def test_default_workers_bounds():
    assert 0 <= default_workers(torch.device("cpu")) <= 2
    assert 0 <= default_workers(torch.device("cuda")) <= 8
