"""Reference solution of labs/09_plan_3d_lab.ipynb: the fastest dp x tp x pp plan under a memory cap per rank.

The search Megatron-LM's and torchtitan's users run by hand (Narayanan et al. 2021, Sec. 3, "takeaways"): tensor
parallelism inside a node, where NVLink carries its per-layer all-reduces; pipeline stages and data parallelism
for the rest; then the micro-batch, the ZeRO stage (any, with or without a pipeline), interleaving and recompute.
``utils.planner.estimate`` does the arithmetic; this function enumerates, keeps the plans whose memory per rank
stays under ``memory_cap`` (headroom the planner does not model: the allocator's caches, fragmentation), and
returns the fastest.
"""

from utils.planner import CHECKPOINTING, Plan, estimate

MICRO_BATCHES = (1, 2, 4)  # sequences per micro-batch the lab lets you try
CHUNKS = (1, 2)  # v: model chunks per pipeline rank (interleaved 1F1B when 2)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_plan(model, cluster, n_gpus, global_batch, precision, memory_cap):
    """The fastest plan of ``n_gpus`` GPUs holding at most ``memory_cap`` bytes per rank, by ``estimate``."""
    best = None
    for tp in (t for t in divisors(cluster.gpus_per_node) if n_gpus % t == 0):  # tp within a node
        for pp in divisors(n_gpus // tp):
            dp = n_gpus // (tp * pp)
            for zero in (0, 1, 2, 3):
                for v in (c for c in CHUNKS if c == 1 or pp > 1):
                    for mb in MICRO_BATCHES:
                        for ckpt in CHECKPOINTING:
                            try:  # Plan and estimate refuse, naming the numbers, what does not divide
                                plan = Plan(global_batch, mb, dp, tp, pp, v, zero, precision, ckpt,
                                            sequence_parallel=tp > 1)
                                est = estimate(model, plan, cluster)
                            except ValueError:
                                continue
                            if est.memory.total <= memory_cap and (best is None or est.step_time < best[0]):
                                best = (est.step_time, plan)
    if best is None:
        raise ValueError(f"no plan of {n_gpus} GPUs holds under {memory_cap:,.0f} B per rank for a global batch of "
                         f"{global_batch}: add GPUs or raise the cap.")
    return best[1]
