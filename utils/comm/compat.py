"""Three collectives under one name on every torch the course supports (2.11 to 2.15).

torch moves under a course that must run for years. Three differences meet the lessons:

- ``all_gather_single`` / ``reduce_scatter_single`` are torch 2.13's names for what torch 2.11
  calls ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (2.13 and 2.14 keep the old names, with a
  deprecation warning; 2.15 keeps them as aliases, without one). Same collective, same arguments: we call
  whichever this torch has.
- ``all_to_all`` with *lists* of tensors: torch 2.11's gloo does not have it ("Backend gloo does
  not support alltoall"), while its single-tensor form, ``all_to_all_single``, works everywhere.
  When the backend refuses the list form, we concatenate the list, send it with
  ``all_to_all_single`` (each piece's size as its split size) and cut the result back into the
  output list. Same bytes on the wire, same result; only the route differs, so nothing is announced.

Each function looks up ``torch.distributed``'s function when it is *called*, so ``CommLedger``'s
wrappers and a test's monkeypatching take effect. ``CommLedger`` also wraps these three functions,
so a call through them is recorded once, under the name used here, whichever route it took
(notebook 01a, lab 03 and its tests). Call them through the module (``utils.comm.compat.all_to_all``):
a name imported with ``from utils.comm.compat import ...`` escapes the ledger.
"""

import torch
import torch.distributed as dist

__all__ = ["all_gather_single", "reduce_scatter_single", "all_to_all"]


def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
    """Every rank's ``input_tensor`` (s elements), concatenated in rank order into ``output_tensor`` (n s)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch 2.13 : older
    return gather(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """``input`` (n s elements) reduced over the ranks; rank r receives piece r (s elements) in ``output``."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # torch 2.13 : older
    return scatter(output, input, op=op, group=group, async_op=async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None):
    """Rank r sends ``input_tensor_list[j]`` to rank j and receives rank j's piece in ``output_tensor_list[j]``.

    Synchronous (no ``async_op``): the fallback must copy the received pieces out after the collective.
    """
    try:
        dist.all_to_all(output_tensor_list, input_tensor_list, group=group)
        return
    except RuntimeError as error:  # raised by the backend before anything is sent, on every rank alike
        if "does not support alltoall" not in str(error):
            raise
    _all_to_all_by_single(output_tensor_list, input_tensor_list, group)


def _all_to_all_by_single(output_tensor_list, input_tensor_list, group):
    """The list all-to-all as one ``all_to_all_single`` over the concatenated pieces (gloo on torch 2.11)."""
    send_sizes = [t.numel() for t in input_tensor_list]
    recv_sizes = [t.numel() for t in output_tensor_list]
    send = torch.cat([t.reshape(-1) for t in input_tensor_list])  # (sum of send_sizes,)
    recv = send.new_empty(sum(recv_sizes), dtype=output_tensor_list[0].dtype)  # (sum of recv_sizes,)
    dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes, group=group)
    for out, piece in zip(output_tensor_list, recv.split(recv_sizes)):
        out.copy_(piece.view_as(out))
