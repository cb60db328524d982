"""FSDP2 on the course model, the plan lesson 04a derives (notebooks/04a_fsdp2_zero_redundancy.ipynb): the blocks
first, the root last, and the tied mix1/mix2 pair in one group. Lesson 04's script and lesson 08's
``LitToy.configure_model`` apply the same plan from here."""


def shard_with_fsdp2(net, mesh):
    """FSDP2 on ToyNet, blocks first and the root last; the tied mix1/mix2 pair in ONE group (lesson 04)."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(net.embed, mesh=mesh)
    fully_shard([net.mix1, net.mix2], mesh=mesh)  # one tensor used by two layers: one group
    fully_shard(net.head, mesh=mesh)
    fully_shard(net, mesh=mesh)  # the root: the leftovers (frozen input_scale) and the driver
