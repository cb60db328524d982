"""What a rank holds, and sharding it (lessons 03, 04, 07, 09c): ``memory`` (bytes a rank holds, counted from
tensors or from every live tensor, beside the ZeRO paper's formulas), ``adam`` (Adam's update rule written out, bit
for bit ``torch.optim.Adam``'s), ``groups`` (the ``params`` a sharded optimizer takes, as torch.optim takes them:
lesson 03's ``ZeroDP``, lab 03), ``activation_memory`` (what autograd keeps for backward: lessons 07 and 08),
``recompute`` (keeping less of it: none, full and selective activation checkpointing run on the capstone's layers,
the bytes kept and the FLOPs spent: lesson 09c), ``fsdp2`` (the course model's FSDP2 plan, lesson 04's equal batch
slices and the loop its ``torchrun`` script runs: lessons 04 and 08) and ``fsdp2_controls`` (FSDP2's prefetch,
resharding and gradient accumulation, counted: lesson 04c).
"""
