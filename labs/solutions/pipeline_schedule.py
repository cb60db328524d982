"""Reference solution of labs/06_pipeline_lab.ipynb: the 1F1B (PipeDream-Flush) order of one stage.

Narayanan et al. (2021, arXiv 2104.04473), section 2.2: stage s of p first runs p - s - 1
*warm-up* forwards (stage 0 the most, the last stage none), so that by the time micro-batch 0's
backward comes back the pipeline is full; then it alternates one forward and one backward (the
*steady state*); then the remaining backwards (the *cool-down*). Stage s never holds more than
p - s micro-batches of activations, whatever the number m of micro-batches; GPipe holds m. The
bubble is the same as GPipe's, (p - 1) / (m + p - 1).
"""


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The ops of stage ``stage``, in order: ("F", mb) forward, ("B", mb) backward of micro-batch mb."""
    warmup = min(stages - stage - 1, microbatches)  # never more warm-up forwards than micro-batches
    ops = [("F", mb) for mb in range(warmup)]
    for i in range(microbatches - warmup):  # steady state: the next forward, then the oldest backward
        ops.append(("F", warmup + i))
        ops.append(("B", i))
    ops += [("B", mb) for mb in range(microbatches - warmup, microbatches)]  # cool-down
    return ops
