"""3-D parallelism bookkeeping: the meshes of a world size, and what each mesh dimension costs (notebook 09).

Lesson 09 trains one transformer on a ``DeviceMesh`` with three named dimensions, ``("dp", "pp", "tp")``,
and puts its measurements beside the formulas of lessons 02-06. The plumbing lives here so the
lesson can show the parallelism itself:

- ``meshes(world_size)`` lists the factorisations of a size (the planner's ``check_plan`` says which fit the model:
  ``plan3d``).
- ``MeshCommLedger``: every collective and point-to-point message a rank runs, *attributed to a mesh
  dimension by its process group*. ``utils.CommLedger`` (lesson 01) wraps ``torch.distributed``'s
  Python functions, so it does not see DTensor's functional collectives (lesson 04b); this ledger is
  a ``TorchDispatchMode``, like torch's ``CommDebugMode``, so it sees the ops themselves: FSDP2's
  all-gathers and reduce-scatters (``c10d`` ops), DTensor's (``_c10d_functional`` ops) and the
  pipeline's sends (``c10d.send``). Wire bytes use lesson 01's ring convention (``RING_WIRE_FACTOR``).
- ``model_state_bytes``: parameters, gradients and optimizer state this rank holds, counted from
  the local shards (``DTensor.to_local()``), each tensor once.
"""

import dataclasses

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from ..comm.ledger import RING_WIRE_FACTOR
from ..comm.ledger import tensor_bytes as _bytes  # bytes of a tensor or of a list of them, as CommLedger counts
from ..sharding.memory import state_bytes

__all__ = ["meshes", "MeshCommLedger", "model_state_bytes"]

MESH_DIMS = ("dp", "pp", "tp")  # outermost to innermost: tp's ranks are neighbours (the fastest links)


def meshes(world_size):
    """Every (dp, pp, tp) whose product is ``world_size``, dp-major: [(4,1,1), (2,2,1), ...]."""
    return [(d, p, world_size // (d * p)) for d in range(world_size, 0, -1) for p in range(1, world_size // d + 1)
            if world_size % (d * p) == 0]


@dataclasses.dataclass
class MeshComm:
    """One collective or message: op, mesh dimension, ranks in its group, bytes, forward or backward."""

    op: str
    dim: str
    group_size: int
    payload_bytes: int
    wire_bytes: float


# c10d op (FSDP2, dist.*) or functional op (DTensor) -> lesson 01's name for the ring factor.
_OPS = {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "all_reduce": "all_reduce",
        "all_reduce_coalesced": "all_reduce", "_allgather_base_": "all_gather", "allgather_": "all_gather",
        "allgather_into_tensor_coalesced_": "all_gather", "all_gather_into_tensor": "all_gather",
        "all_gather_into_tensor_coalesced": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
        "reduce_scatter_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
        "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
        "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all", "broadcast_": "broadcast",
        "broadcast": "broadcast", "send": "send", "recv_": "recv"}


class MeshCommLedger(TorchDispatchMode):
    """Records this rank's communication per mesh dimension while active (``with MeshCommLedger(mesh):``).

    A group that is none of the mesh's dimensions is recorded under its name in ``extra_groups``
    (e.g. ``{"tied": group}``) or else as "other"."""

    def __init__(self, mesh, extra_groups=None):
        super().__init__()
        self.records: list[MeshComm] = []
        self._dim_of = {mesh.get_group(d).group_name: d for d in mesh.mesh_dim_names}
        for name, group in (extra_groups or {}).items():
            self._dim_of[group.group_name] = name

    def _group(self, args):
        for a in args:
            if isinstance(a, str) and a in self._dim_of:
                return self._dim_of[a], a
            if isinstance(a, torch.ScriptObject):  # a c10d op holds its ProcessGroup boxed
                group = torch._C._distributed_c10d.ProcessGroup.unbox(a)
                return self._dim_of.get(group.group_name, "other"), group
        return "other", None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor turn the op into plain ops and collectives, then see those
        ns, name = func.namespace, func._schema.name.split("::")[-1]
        if ns in ("c10d", "_c10d_functional", "_c10d_functional_autograd") and name in _OPS:
            op = _OPS[name]
            dim, group = self._group(list(args) + list(kwargs.values()))
            if isinstance(group, str):  # functional ops name their group
                group = torch.distributed.distributed_c10d._resolve_process_group(group)
            n = group.size()
            tensors = [a for a in args if isinstance(a, (torch.Tensor, list, tuple))]
            payload = max(_bytes(t) for t in tensors)  # the full-sized side (lesson 01's convention)
            if ns != "c10d" and op == "all_gather":
                payload *= n  # a functional all-gather is given only its input shard
            self.records.append(MeshComm(op, dim, n, payload, payload * RING_WIRE_FACTOR[op](n)))
        return func(*args, **kwargs)

    def wire_bytes(self, dim, op=None):
        """Bytes this rank sent on mesh dimension ``dim`` (one op's, or all)."""
        return sum(r.wire_bytes for r in self.records if r.dim == dim and (op is None or r.op == op))

    def summary(self):
        """{(dim, op): {"calls", "payload_bytes", "wire_bytes"}}, for a table."""
        out = {}
        for r in self.records:
            row = out.setdefault((r.dim, r.op), {"calls": 0, "payload_bytes": 0, "wire_bytes": 0.0})
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["wire_bytes"] += r.wire_bytes
        return out


def model_state_bytes(module, optimizer):
    """{"params", "grads", "optim"}: bytes of the local shards this rank holds, each tensor once
    (``utils.sharding.memory.state_bytes`` by tensor: what the planner's formulas count)."""
    held = state_bytes(module.parameters(), optimizer, by="tensor")
    return {k: held[k] for k in ("params", "grads", "optim")}

