"""Reference solution of labs/06_pipeline_lab.ipynb: Megatron-LM's interleaved 1F1B order of one rank.

Narayanan et al. (2021, arXiv 2104.04473), section 2.2.2: rank r of p holds v model chunks, the
virtual stages r, r + p, ..., r + (v - 1) p, so a micro-batch visits every rank v times and the
fill and drain of the pipeline take 1/v as long: a bubble of (p - 1) / (v m + p - 1). Micro-batches
go through in groups of p: the p micro-batches of a group through chunk 0, then the same p through
chunk 1, ..., then the next group; backwards the same, chunks in reverse. Rank r warms up with
min(v m, (p - r - 1) 2 + (v - 1) p) forwards (at m = p too: only rank 0's
reaches v m), then alternates one forward and one
backward, then cools down. The order is the one torch's ``ScheduleInterleaved1F1B`` computes.
"""


def interleaved_one_f_one_b(rank: int, ranks: int, microbatches: int, chunks: int) -> list[tuple[str, int, int]]:
    """The ops of rank ``rank`` of ``ranks``, in order: ("F" or "B", micro-batch, chunk)."""
    if microbatches % ranks:
        raise ValueError(f"interleaved 1F1B sends micro-batches in groups of p = {ranks}: {microbatches} "
                         f"micro-batches is not a multiple of {ranks}; use {ranks * max(1, microbatches // ranks)} or "
                         f"{ranks * (microbatches // ranks + 1)}.")
    total = microbatches * chunks  # this rank runs v forwards (and v backwards) per micro-batch

    def unit(k, backward):  # the k-th forward (or backward) of this rank: (micro-batch, chunk)
        group, within = divmod(k, ranks * chunks)  # groups of p micro-batches x v chunks
        chunk = within // ranks
        return group * ranks + within % ranks, (chunks - 1 - chunk) if backward else chunk

    warmup = min(total, (ranks - rank - 1) * 2 + (chunks - 1) * ranks)  # as torch's _get_warmup_ops
    ops = [("F", *unit(k, False)) for k in range(warmup)]
    for i in range(total - warmup):  # steady state: the next forward, then the oldest backward
        ops += [("F", *unit(warmup + i, False)), ("B", *unit(i, True))]
    return ops + [("B", *unit(k, True)) for k in range(total - warmup, total)]  # cool-down
