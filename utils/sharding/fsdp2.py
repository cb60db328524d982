"""FSDP2 on the course model, the plan lesson 04a derives (notebooks/04a_fsdp2_zero_redundancy.ipynb): the blocks
first, the root last, and the tied mix1/mix2 pair in one group. Lesson 04's script and lesson 08's
``LitToy.configure_model`` apply the same plan from here; lesson 04c (notebooks/04c_fsdp2_overlap_and_accumulation.ipynb)
passes ``reshard_after_forward`` to the blocks."""

#: the groups ``shard_with_fsdp2`` makes, in forward order: the ToyNet submodules of each block group
FSDP2_GROUPS = (("embed",), ("mix1", "mix2"), ("head",))


def shard_with_fsdp2(net, mesh, reshard_after_forward=None):
    """FSDP2 on ToyNet, blocks first and the root last; the tied mix1/mix2 pair in ONE group (lesson 04).

    ``reshard_after_forward`` goes to the three block groups (``None``: FSDP2's default, True for them); the
    root keeps FSDP2's default, False for a root (lesson 04c)."""
    from torch.distributed.fsdp import fully_shard

    blocks = {} if reshard_after_forward is None else {"reshard_after_forward": reshard_after_forward}
    fully_shard(net.embed, mesh=mesh, **blocks)
    fully_shard([net.mix1, net.mix2], mesh=mesh, **blocks)  # one tensor used by two layers: one group
    fully_shard(net.head, mesh=mesh, **blocks)
    fully_shard(net, mesh=mesh)  # the root: the leftovers (frozen input_scale) and the driver
