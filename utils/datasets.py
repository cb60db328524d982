"""Small real data sets that ship inside an installed package: nothing is downloaded at run time.

Derived in notebook 02 (data parallelism), where the digits train the course model.
"""

import torch


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
