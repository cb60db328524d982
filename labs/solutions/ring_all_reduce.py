"""Reference solution of labs/01_ring_all_reduce_lab.ipynb: a ring all-reduce from isend/irecv.

The algorithm of Patarasuk & Yuan (2009), popularised for deep learning by Baidu's ring-allreduce
and used by NCCL: cut the tensor into n chunks, then

1. **reduce-scatter**, n-1 steps: every rank sends one chunk to its right neighbour and adds the
   chunk it receives from its left neighbour. Afterwards rank r owns the complete sum of chunk
   (r+1) % n;
2. **all-gather**, n-1 steps: every rank passes the complete chunk it last obtained to the right,
   and stores the one it receives. Afterwards every rank holds every complete chunk.

Each rank sends 2(n-1) chunks of about numel/n elements: 2(n-1)/n of the tensor, whatever n.
"""

import torch
import torch.distributed as dist


def _exchange(send_buf, recv_buf, right, left):
    """Send to the right neighbour and receive from the left one, at the same time.

    Both operations are posted before either is waited on: with a blocking ``dist.send`` first on
    every rank, every rank waits for a receive that nobody has posted yet (gloo's send waits for
    the matching recv, at any size), and the ring deadlocks.
    """
    if send_buf.numel() == 0 and recv_buf.numel() == 0:
        return  # an empty chunk (numel < world size): both sides know it, nothing to say
    requests = []
    if send_buf.numel():
        requests.append(dist.isend(send_buf, right))
    if recv_buf.numel():
        requests.append(dist.irecv(recv_buf, left))
    for request in requests:
        request.wait()


def ring_all_reduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` over all ranks of the default group, in place, like ``dist.all_reduce``."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return
    flat = tensor.view(-1)  # (numel,), a view: writing into it writes into tensor
    # n views of nearly equal size: the first numel % n chunks have one element more.
    chunks = torch.tensor_split(flat, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    scratch = torch.empty_like(chunks[0])  # chunks[0] is a largest chunk

    # 1. Reduce-scatter: at step s, send chunk (rank - s) and add into chunk (rank - s - 1).
    for step in range(n - 1):
        send, recv = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        incoming = scratch[: recv.numel()]
        _exchange(send, incoming, right, left)
        recv.add_(incoming)
    # Now chunk (rank + 1) % n on this rank is the sum over all ranks.

    # 2. All-gather: at step s, send complete chunk (rank + 1 - s), receive chunk (rank - s).
    for step in range(n - 1):
        send, recv = chunks[(rank + 1 - step) % n], chunks[(rank - step) % n]
        _exchange(send, recv, right, left)
