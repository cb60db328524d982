"""A failed launch, read in one line per rank: which ``torch.distributed`` call each rank waits in, and the line of
the program that made it (labs 11a and 11b, which derive it; lesson 11b reads the same reports by eye).

``run_ranks`` raises ``RankTimeoutError`` (with ``.stacks``: each hung rank's faulthandler stack) when the ranks
outlast the timeout, and ``RankError`` when a rank raises (its first line names the rank that failed *first*).
``run_broken`` catches both and returns the error as a value; ``summary`` prints the part that matters.
"""

import re
import time

from .errors import RankError, RankTimeoutError
from .kernel import run_ranks
from .restricted import quoted_line

# faulthandler's lines look like: File "/path/to/file.py", line 12 in all_reduce (innermost first). A notebook's
# cells are in linecache, so the line number of a program's frame gives back its source.
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')


def run_broken(fn, *args, world_size, timeout):
    """Run fn(*args) on ``world_size`` gloo ranks; return (the RankTimeoutError or RankError it ended with, or
    None if it finished, and the seconds it took)."""
    start = time.perf_counter()
    try:
        run_ranks(fn, *args, world_size=world_size, timeout=timeout, backend="gloo", verbose=False)
        err = None
    except (RankTimeoutError, RankError) as caught:
        err = caught
    return err, time.perf_counter() - start


def where(stack):
    """'in all_reduce, called from program_A: <its line>' from one rank's faulthandler stack."""
    frames = [m.groupdict() for m in FRAME.finditer(stack)]
    if not frames:
        return stack.strip().splitlines()[0] if stack.strip() else "?"
    ours = next((f for f in frames if not re.search(r"(site|dist)-packages|<frozen", f["file"])), frames[-1])
    torch_call = frames[0]["fn"]  # the innermost Python frame: the torch function the rank is waiting in
    source = quoted_line(ours["file"], int(ours["line"]))
    return f"in {torch_call:<17} called from {ours['fn']}: {source}"


def summary(err):
    """The first line of the report, then one line per rank."""
    if err is None:
        return "finished without error"
    lines = [str(err).splitlines()[0][:300]]
    if isinstance(err, RankTimeoutError):
        lines += [f"  rank {r}: {where(s)}" for r, s in err.stacks.items()]
    else:
        lines += [f"  {line[:200]}" for line in str(err).splitlines() if re.match(r"rank \d+: ", line)]
    return "\n".join(lines)
