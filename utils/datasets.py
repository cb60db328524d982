"""Small real data sets that ship inside an installed package: nothing is downloaded at run time.

Derived in notebook 02 (data parallelism), where the digits train the course model, in one fixed shuffled order
(``digits_in_order``) that lessons 02, 08 and their scripts share, and ``batch``, the global batch of a step that
lessons 02, 04 and 06 and their ``torchrun`` scripts train on. ``AugmentedDigits``
(random shifts and noise in pure Python) comes from lesson 08: notebooks/08a_lightning_strategies.ipynb seeds
its workers with ``seed_everything``, notebooks/08b_lightning_speedups.ipynb loads it with ``num_workers``.
"""

import torch
from torch.utils.data import Dataset


def digits(dtype=torch.float32):
    """scikit-learn's handwritten digits: 1,797 images of 8x8 pixels, classes 0-9.

    Returns ``(x, y)``: ``x`` of shape (1797, 64) scaled to [0, 1], ``y`` of shape (1797,) int64.
    The data file is inside the scikit-learn package (UCI ML hand-written digits).
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=dtype) / 16.0  # pixel values are 0..16
    y = torch.tensor(data.target, dtype=torch.int64)
    return x, y


def digits_in_order():
    """The digits in lesson 02's fixed order: (1797, 64) float in [0, 1], (1797,) int64."""
    x, y = digits()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order], y[order]


def batch(step, size, ordered=True):
    """Global batch ``step`` of ``size`` digits: lesson 02's shuffled order (``ordered``) or the file's order
    (lessons 04 and 06). Past the end of the 1797 digits it starts again from the first batch."""
    x, y = digits_in_order() if ordered else digits()
    per_epoch = len(x) // size
    rows = slice((step % per_epoch) * size, (step % per_epoch + 1) * size)
    return x[rows], y[rows]  # (size, 64), (size,)


class AugmentedDigits(Dataset):
    """Digits, randomly shifted and noised per sample in pure Python: slow on purpose, like decode + augment."""

    def __init__(self, x, y, passes=120):  # ~1-2 ms a sample here: an epoch long enough to time
        if passes < 0:
            raise ValueError(f"passes={passes}: the number of augmentation passes is 0 or more")
        self.x, self.y, self.passes = x, y, passes

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        img = self.x[i].view(8, 8).tolist()  # Python lists: per-pixel work in the interpreter
        dy, dx = torch.randint(-1, 2, (2,)).tolist()  # random shift: worker-seeded
        noise = (torch.rand(64) * 0.05).tolist()
        for _ in range(self.passes):  # each pass: roll by (dy, dx), blend in the noise
            img = [[0.9 * img[(r + dy) % 8][(c + dx) % 8] + noise[8 * r + c] for c in range(8)] for r in range(8)]
        return torch.tensor(img).view(64), self.y[i]  # (64,), ()
