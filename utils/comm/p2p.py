"""Point to point without deadlock: ``sendrecv``, MPI's ``Sendrecv`` from ``dist.isend`` / ``dist.irecv``.

Derived in notebook 01a (point to point: why a ring of blocking sends deadlocks, and this fix); notebook 01b's
ring all-reduce and naive all-reduce are built from it. It calls ``dist.isend`` / ``dist.irecv`` through the
module at call time, so ``CommLedger`` sees every send.
"""

import torch
import torch.distributed as dist

__all__ = ["sendrecv"]


def sendrecv(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int, group=None) -> None:
    # Send send_buf to rank dst while receiving recv_buf from rank src; return when both are done.
    # dst and src are global ranks; ``group`` (a subgroup holding both) is the channel the messages go on.
    send = (lambda: dist.isend(send_buf, dst, group=group)) if send_buf.numel() else None
    recv = (lambda: dist.irecv(recv_buf, src, group=group)) if recv_buf.numel() else None  # skip empty messages:
    # both sides know the sizes, so they skip together, and an empty message still costs a round trip
    order = (send, recv) if dist.get_rank() < dst else (recv, send)  # the highest rank of a cycle receives first
    works = [post() for post in order if post is not None]
    for work in works:
        work.wait()
