"""A parallelism planner: for a transformer, a mesh and a cluster, what does each rank hold, send and wait for?

Issue 15; the capstone lesson calls it beside the course's measured runs. Pure functions on three small
dataclasses, every formula a short named function with its source:

- ``ModelShape`` (the transformer, dense or with experts), ``Plan`` (mesh dp x tp x pp x cp, ep borrowed from
  dp x cp, with v virtual stages, batch, precision,
  ZeRO stage, activation checkpointing), ``Cluster`` (GPUs per node, memory, bandwidths, peak FLOP/s);
- ``estimate(model, plan, cluster)`` -> ``Estimate``: Psi, memory per rank term by term
  (``.memory.parameters`` ...), ``.bytes_per_step["dp" | "tp" | "pp" | "tied" | "cp" | "ep"]``, ``.bubble``, ``.times``,
  ``.step_time``, ``.mfu``, and ``.fits`` with ``.reason`` when it does not;
- ``best_plans(model, cluster, n_gpus, global_batch)``: every mesh, ZeRO stage and checkpointing, fastest first;
- ``flops_per_token(model, checkpointing="none")`` -> (model FLOPs, hardware FLOPs) per token of a training step
  (PaLM's count, Chowdhery et al. 2022, appendix B); lessons 08 and 09 take their FLOPs from it.

Notation: Psi is a *count* of parameters; bytes carry their factor (fp32 weights 4 Psi bytes, mixed-precision
Adam model states 16 Psi = 2 Psi + 2 Psi + 12 Psi bytes, ZeRO paper). Per-rank bytes on the wire follow the ring
convention of ``utils.comm.ledger.CommLedger`` (all-reduce 2(n-1)/n of its payload, all-gather and reduce-scatter
(n-1)/n, send 1x), so a measured ledger and the planner can be put side by side. Ranks are numbered tp fastest,
then cp, then pp, then dp (the order [TP, CP, PP, DP] of the Llama 3 paper, Grattafiori et al. 2024, Figure 5): a group
stays inside a node when the product of its own and the faster dimensions fits in one node.

Validated term by term against measured runs of lesson 09 (FSDP2 x TP/SP x pipelining of a tiny Llama), which
added three named terms: the tp collectives at the ends of the model (``tp_end_bytes``), the tied embedding's
gradient all-reduce between first and last stage (``bytes_per_step["tied"]``), and ZeRO-2/3 inside a pipeline
keeping the weights gathered and the gradients unreduced over the micro-batches (``dp_bytes(pipelined=True)``
measured; ``Memory.gathered`` from FSDP2's source, not measured), and full recompute's tp replay (``tp_bytes``:
3 s b h (t-1)/t values more per layer and micro-batch with sequence parallelism, measured). Lesson 09c measured the
activations a layer keeps (none, full, selective), exactly, and added ``ModelShape.attention`` ("flash": no scores
kept) and ``fused_kernels`` (False: Hugging Face's plain RMSNorm and SwiGLU keep more), and full recompute's early
stop in the FLOPs.
What is left out, on purpose: the loss's own small reductions under vocab-parallel cross-entropy, Adam's step
counters (a few bytes per parameter tensor), attention with a KV cache, offload, overlap of communication with compute (every byte here waits), and the
allocator's caches and fragmentation (a real peak is higher).

Context parallelism (ring attention, lesson 14) and expert parallelism (all-to-all dispatch, lesson 15) are in
``cp_ep`` (issue 27), validated against those lessons' measurements re-run on CPU ranks (tests/test_planner_cp_ep.py).
Left out there: Ulysses-style cp, the MoE router's imbalance (a uniform router is assumed) and dropped tokens.

Four files, read in this order: ``shapes`` (the questions), ``costs`` (one formula a term), ``cp_ep`` (the cp and
ep terms), ``estimate`` (the terms summed, and the search).
"""

from .shapes import (GB, PRECISIONS, CHECKPOINTING, ModelShape, Cluster, H100_NODE, Plan, check_plan, GPT2_SMALL,
                     LLAMA2_7B, LLAMA2_70B, MIXTRAL_8X7B)
from .costs import (layer_parameters, layer_matrices, embedding_parameters, parameter_count, stage_parameters,
                    layer_activation_bytes, in_flight, logits_bytes, dp_bytes, tp_bytes, tp_end_bytes, tied_bytes,
                    pp_bytes, flops_per_token, expert_parameters)
from .cp_ep import cp_bytes, ep_bytes, ep_tokens, spans
from .estimate import Memory, Estimate, link_bandwidth, estimate, best_plans

__all__ = ["GB", "PRECISIONS", "CHECKPOINTING", "ModelShape", "Cluster", "H100_NODE", "Plan", "check_plan", "GPT2_SMALL", "LLAMA2_7B", "LLAMA2_70B", "MIXTRAL_8X7B", "layer_parameters", "layer_matrices", "embedding_parameters", "parameter_count", "stage_parameters", "layer_activation_bytes", "in_flight", "logits_bytes", "dp_bytes", "tp_bytes", "tp_end_bytes", "tied_bytes", "pp_bytes", "flops_per_token", "expert_parameters", "cp_bytes", "ep_bytes", "ep_tokens", "spans", "Memory", "Estimate", "link_bandwidth", "estimate", "best_plans"]
