"""Which tensor-parallel degrees fit a model, and a clear error at once when one does not.

Derived in notebook 05 (model parallelism), where Megatron-style tensor parallelism (Shoeybi et
al., arXiv 1909.08053) cuts every weight matrix of a transformer layer into t pieces: the
column-parallel layers by *output* features, the row-parallel layers by *input* features, and the
attention by *heads*. Each piece must be whole, so t must divide the hidden size, the MLP's inner
size and the number of heads. Used by the notebook and by lab 05 (``utils.checkers.tensor_parallel``)::

    check_tp_degree(3, hidden=1000)
    # ValueError: hidden size 1000 is not divisible by tensor-parallel degree 3; use 2, 4 or 5.

Without the check the mistake surfaces much later and far away: ``torch.chunk`` hands out pieces
of unequal size (or fewer than t of them), and the all-reduce then fails, or hangs, on the rank
whose piece has the wrong shape.
"""


def valid_tp_degrees(*sizes, up_to=None):
    """Every degree t > 1 that divides all ``sizes`` (t = 1, no tensor parallelism, always fits)."""
    sizes = [int(s) for s in sizes]
    up_to = up_to or min(sizes)
    return [t for t in range(2, up_to + 1) if all(s % t == 0 for s in sizes)]


def nearest_tp_degrees(degree, *sizes, count=3):
    """The ``count`` valid degrees closest to ``degree`` (ties: the smaller first), in increasing order."""
    valid = valid_tp_degrees(*sizes)
    return sorted(sorted(valid, key=lambda t: (abs(t - degree), t))[:count])


def _say(numbers):
    """[2, 4, 5] -> '2, 4 or 5'."""
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def check_tp_degree(degree, **sizes):
    """Raise ``ValueError`` at once unless the tensor-parallel ``degree`` divides every named size.

    ``sizes`` are keyword arguments whose names appear in the message, e.g.
    ``check_tp_degree(4, hidden=64, heads=6)`` -> "number of heads 6 is not divisible by
    tensor-parallel degree 4; use 2, 3 or 6." (the degrees that divide *all* the sizes given). Names
    understood: ``hidden`` (hidden size), ``heads`` (number of heads), ``ffn`` (MLP inner size),
    ``out_features`` / ``in_features`` (one linear layer); any other name is printed as it is.
    """
    label = {"hidden": "hidden size", "heads": "number of heads", "ffn": "MLP inner size",
             "out_features": "out_features", "in_features": "in_features"}
    if not isinstance(degree, int) or degree < 1:
        raise ValueError(f"tensor-parallel degree must be a positive int, got {degree!r}.")
    for name, size in sizes.items():
        if size % degree:
            valid = nearest_tp_degrees(degree, *sizes.values())
            fix = f"use {_say(valid)}" if valid else "only 1 (no tensor parallelism) divides them all"
            named = ", ".join(f"{k}={v}" for k, v in sizes.items())
            others = "" if len(sizes) == 1 else f" (the degrees that divide {named})"
            raise ValueError(f"{label.get(name, name)} {size} is not divisible by tensor-parallel degree "
                             f"{degree}; {fix}{others}.")
    return degree
