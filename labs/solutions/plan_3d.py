"""Reference solution of labs/09_plan_3d_lab.ipynb: choose a dp x tp x pp plan with the planner's estimate.

The search is the one Megatron-LM's and torchtitan's users run by hand (Narayanan et al. 2021, Sec. 3,
"takeaways"): keep tensor parallelism inside a node, where NVLink carries its per-layer all-reduces; use
pipeline stages across nodes; give the rest to data parallelism; then pick the micro-batch, the ZeRO stage
and the recompute that fit in memory at the least predicted step time. ``utils.planner.estimate`` does the
arithmetic; this function only enumerates and keeps the fastest plan that fits. It never calls
``best_plans`` (the lab asks you to write that search).
"""

from utils.planner import CHECKPOINTING, Plan, estimate

MICRO_BATCHES = (1, 2, 4)  # sequences per micro-batch the lab lets you try
CHUNKS = (1, 2)  # v: model chunks per pipeline rank (interleaved 1F1B when 2)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_plan(model, cluster, n_gpus, global_batch, precision="bf16"):
    """The fastest plan of ``n_gpus`` GPUs that fits ``cluster.memory_bytes``, by ``estimate``; ValueError if none."""
    best = None
    for tp in (t for t in divisors(cluster.gpus_per_node) if n_gpus % t == 0):  # tp within a node
        for pp in divisors(n_gpus // tp):
            dp = n_gpus // (tp * pp)
            # a pipeline with ZeRO-2/3 would reduce or gather every micro-batch's gradients or weights: at most ZeRO-1
            for zero in (z for z in (0, 1, 2, 3) if pp == 1 or z <= 1):
                for v in (c for c in CHUNKS if c == 1 or pp > 1):
                    for mb in MICRO_BATCHES:
                        for ckpt in CHECKPOINTING:
                            try:  # Plan and estimate refuse, naming the numbers, what does not divide
                                plan = Plan(global_batch, mb, dp, tp, pp, v, zero, precision, ckpt,
                                            sequence_parallel=tp > 1)
                                est = estimate(model, plan, cluster)
                            except ValueError:
                                continue
                            if est.fits and (best is None or est.step_time < best[0]):
                                best = (est.step_time, plan)
    if best is None:
        raise ValueError(f"no plan of {n_gpus} GPUs fits {cluster.memory_bytes / 1e9:g} GB per GPU for a global "
                         f"batch of {global_batch}: add GPUs or memory.")
    return best[1]
