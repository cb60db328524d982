"""A tiny Hugging Face Llama trained on a 3-D ``DeviceMesh``: pipeline split, tensor parallelism, FSDP2 (notebook 09).

Lesson 09 (``notebooks/09a_3d_mesh.ipynb``; part 2, ``09b_3d_costs_and_planner.ipynb``, measures its costs) derives every piece of this module and shows its source;
the checker of lab 09 (``utils/checkers/plan_3d.py``) runs the learner's plan through the same code, so
there is one copy. Read it in this order:

- the model and its task: ``make_model`` (a ``LlamaForCausalLM`` from a config, random weights, **tied**
  embedding), ``make_batch`` (counting modulo the vocabulary) and ``loss_fn``;
- ``LlamaStage``: layers ``[lo, hi)`` of the model under their original names, the embedding on the first
  stage, norm and head on the last (the *pipeline split*);
- ``tp_plan``: Megatron's tensor + sequence parallelism for Hugging Face's module names, a plan dict
  keyed by module path, as ``parallelize_module`` takes it;
- ``build``: given a ``utils.planner.Plan`` (``plan3d.mesh_plan``: the sizes, the plan of a mesh), the three
  applied from outside the model, in torchtitan's fixed order
  (split -> TP -> [activation checkpointing] -> [compile] -> FSDP2); the lesson explains each step;
- ``train``: GPipe (or 1F1B) over the stages, the tied weight's gradient summed across first and last stage,
  every message recorded by ``MeshCommLedger``; ``reference``: one process, the unmodified model.
"""

import contextlib
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..launch import rank_device
from ..perf.configs import llama_config
from ..planner.shapes import check_plan
from ..sharding.fsdp2 import full_tensor_unremarked
from .context4d import positions, shard_batch, use_ring_attention
from .mesh3d import MeshCommLedger, model_state_bytes
from .plan3d import BATCH, HEADS, HIDDEN, LAYERS, LR, SEQ, SHAPE, VOCAB, unrunnable

__all__ = ["VOCAB", "HIDDEN", "HEADS", "LAYERS", "SEQ", "BATCH", "LR", "SHAPE", "make_model", "make_batch", "loss_fn",
           "LlamaStage", "hf_name", "tp_plan", "build", "tied_group", "train", "reference"]


def make_model(seed=0, attn_implementation="sdpa"):
    """The tiny ``LlamaForCausalLM`` of ``SHAPE``: 4 layers, hidden 32, 4 heads, vocabulary 32, tied embeddings, an
    MLP of 2h; no download. ``utils.perf.llama_config`` turns the shape into Hugging Face's ``LlamaConfig``.

    Every rank calls it with the same seed, builds the same full model, then keeps its part. Lesson 09c also
    builds it with ``attn_implementation="eager"`` (attention as matmul + softmax, its scores kept)."""
    from transformers import LlamaForCausalLM  # heavy import: only when a model is built
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(SHAPE, attn_implementation))  # sdpa: causal when no mask is given


def make_batch(step):
    """(BATCH, SEQ) inputs and next-token targets: counting mod VOCAB from a random start, stride 1-3, seeded by step.

    After two tokens the rest is determined, so the loss can fall far below ln(VOCAB), the loss of guessing."""
    g = torch.Generator().manual_seed(1000 + step)
    start, stride = torch.randint(0, VOCAB, (BATCH, 1), generator=g), torch.randint(1, 4, (BATCH, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def loss_fn(logits, y):
    """Mean cross-entropy over tokens of (b, s, V) logits and (b, s) targets."""
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


class LlamaStage(nn.Module):
    """Layers [lo, hi) of a LlamaForCausalLM; the embedding on the first stage, the norm and head on the last.

    Lesson 06's manual ``PipelineStage``: the layers keep their original names (``layers.2``, not
    ``layers.0``), so a plan keyed by module path and the one-process gradients line up."""

    def __init__(self, hf, lo, hi, first, last):
        super().__init__()
        self.seq_len = hf.config.max_position_embeddings
        self.embed_tokens = hf.model.embed_tokens if first else None
        self.layers = nn.ModuleDict({str(i): hf.model.layers[i] for i in range(lo, hi)})  # original names
        self.rotary_emb = hf.model.rotary_emb
        self.norm, self.lm_head = (hf.model.norm, hf.lm_head) if last else (None, None)
        self.checkpoint_layers = False  # build sets it (checkpointing="full"): recompute each block in backward
        self.positions = None  # build sets it when cp > 1: the global positions of this cp rank's tokens

    def forward(self, x):  # first stage: (b, s) token ids; others: (b, s/tp, h) hidden states
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        positions = torch.arange(self.seq_len, device=h.device) if self.positions is None else self.positions
        positions = positions.to(h.device)[None]  # of the *whole* sequence (or cp chunk), even when h is s/tp
        cos_sin = self.rotary_emb(h, positions)
        for layer in self.layers.values():  # no mask: sdpa is causal
            if self.checkpoint_layers and torch.is_grad_enabled():  # keep only h; replay the block in backward
                h = checkpoint(layer, h, position_embeddings=cos_sin, use_reentrant=False)
            else:
                h = layer(h, position_embeddings=cos_sin)
        return self.lm_head(self.norm(h)) if self.lm_head is not None else h  # (b, s, V) or (b, s/tp, h)


def hf_name(name):
    """Our stage's parameter name -> the Hugging Face model's (the tied head is the embedding)."""
    return "model.embed_tokens.weight" if name == "lm_head.weight" else "model." + name


def tp_plan(stage):
    """Megatron tensor + sequence parallelism (arXiv 1909.08053, 2205.05198) for the modules this stage holds.

    q/k/v, gate and up are column-parallel; o and down row-parallel, returning the residual stream sharded
    along the sequence (``Shard(1)``); the norms run on that shard; attention and MLP gather the sequence
    first. The embedding is vocabulary-parallel (row-wise), the head column-parallel, its logits gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    plan = {}
    if stage.embed_tokens is not None:  # vocabulary-parallel embedding; its output sharded along the sequence
        plan["embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if stage.lm_head is not None:
        plan["norm"] = SequenceParallel()
        plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())  # logits gathered
    for i in stage.layers:
        p = f"layers.{i}."
        plan.update({
            p + "input_layernorm": SequenceParallel(),  # (b, s/tp, h)
            p + "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},  # HF passes it by name
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),  # all-gather
            p + "self_attn.q_proj": ColwiseParallel(), p + "self_attn.k_proj": ColwiseParallel(),
            p + "self_attn.v_proj": ColwiseParallel(),  # heads/tp per rank
            p + "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),  # reduce-scatter
            p + "post_attention_layernorm": SequenceParallel(),
            p + "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            p + "mlp.gate_proj": ColwiseParallel(), p + "mlp.up_proj": ColwiseParallel(),
            p + "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    return plan


def build(plan, device, lr=LR, compile_backend=None):
    """On every rank: the mesh, this rank's stage (split -> TP -> AC -> compile -> FSDP), its optimizer, as ``plan``
    (a ``utils.planner.Plan``, e.g. ``mesh_plan(dp, pp, tp)``) says.

    The planner's ``check_plan`` refuses a mesh that does not fit the model, with the numbers; ``unrunnable`` a knob
    this step does not have. ``plan.checkpointing == "full"`` checkpoints every block (its activations are
    recomputed in backward, tp collectives included); ``compile_backend`` ("inductor" on GPUs, "aot_eager" to check
    the capture quickly on CPUs) compiles every block with ``torch.compile``; both off by default. ``plan.cp > 1``
    adds a fourth mesh dimension, context parallelism (``context4d``): the mesh is ("dp", "pp", "cp", "tp") and
    FSDP2 shards over dp x cp."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    check_plan(SHAPE, plan)  # tp divides the heads, pp the layers, cp the sequence: the planner's one check
    world = dist.get_world_size()
    why = unrunnable(plan) or (f"its mesh is {plan.world_size} ranks, {world} run it: launch {plan.world_size} or "
                               f"plan for {world}" if plan.world_size != world else "")
    if why:
        raise ValueError(f"{plan}: {why}.")
    dp, pp, tp, cp = plan.dp, plan.pp, plan.tp, plan.cp
    shape, names = ((dp, pp, cp, tp), ("dp", "pp", "cp", "tp")) if cp > 1 else ((dp, pp, tp), ("dp", "pp", "tp"))
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    s, per = mesh.get_local_rank("pp"), LAYERS // pp
    # 1. pipeline split: keep layers [s*per, (s+1)*per) of the full model (same seed on every rank)
    stage = LlamaStage(make_model().to(device), s * per, (s + 1) * per, first=s == 0, last=s == pp - 1)
    if cp > 1:  # 1b. context parallelism: ring attention over mesh["cp"], this rank's tokens' global positions
        use_ring_attention(stage, mesh["cp"].get_group())
        stage.positions = positions(mesh.get_local_rank("cp"), cp, SEQ)
    # 2. tensor (+ sequence) parallelism on mesh["tp"]: it must see plain nn.Linear, before any wrapper
    if tp > 1:
        parallelize_module(stage, mesh["tp"], tp_plan(stage))
        if stage.embed_tokens is not None and stage.lm_head is not None:
            stage.lm_head.weight = stage.embed_tokens.weight  # re-tie: the plan made two DTensors, both Shard(0)
    # 3. activation checkpointing, per block, around the tensor-parallel block: recomputation replays its
    #    tp collectives too
    stage.checkpoint_layers = plan.checkpointing == "full"
    # 4. torch.compile, per block (in place: names unchanged), after AC so the recomputation is compiled too
    if compile_backend is not None:
        for layer in stage.layers.values():
            layer.compile(backend=compile_backend)
    # 5. FSDP2 on mesh["dp"], last: each block, then the stage root (embedding, norm, head: the tied pair in one
    #    group). With a pipeline, keep gathered weights from forward to backward (torchtitan): else every
    #    micro-batch gathers twice.
    #    With cp, over dp x cp flattened: cp ranks hold the same weights and average their gradients like dp's.
    shard_mesh = mesh["dp", "cp"]._flatten("dp_cp") if cp > 1 else mesh["dp"]
    for layer in stage.layers.values():
        fully_shard(layer, mesh=shard_mesh, reshard_after_forward=pp == 1)
    fully_shard(stage, mesh=shard_mesh, reshard_after_forward=pp == 1)
    return mesh, stage, torch.optim.Adam(stage.parameters(), lr=lr)


def tied_group(mesh):
    """The group {first stage, last stage} of this rank's (dp, [cp,] tp) position, or None (every rank creates every
    group, in the same order)."""
    mine = None
    for line in mesh.mesh.movedim(1, -1).flatten(0, -2).tolist():  # the ranks along pp, one line per other position
        ranks = [line[0], line[-1]]
        group = dist.new_group(ranks)
        mine = group if dist.get_rank() in ranks else mine
    return mine


def _local(t):
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def train(plan, steps, measure_step=1, lr=LR, compile_backend=None):
    """Train ``steps`` steps as ``plan`` says (``build``): its (dp, pp, [cp,] tp) mesh, its m micro-batches through
    ``plan.schedule``, "GPipe" (the lesson's) or "1F1B" (``Schedule1F1B``, which needs m >= p), one stage per rank.

    Returns this rank's dict: ``coords`` (d, s, t), ``losses``, ``grads`` of step 0 under Hugging Face's
    names (gathered over dp and tp), ``comm`` (the ``MeshCommLedger`` summary of ``measure_step``),
    ``seconds`` of that step, ``memory`` (``model_state_bytes``), ``tensors`` (parameter tensors of the
    stage), ``tp_sharded`` (which parameters tp shards), ``m`` and ``cp_rank``. ``compile_backend``: as in
    ``build``."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.tensor import DTensor
    warnings.filterwarnings("ignore", category=UserWarning)  # FSDP2's note about views (we do no in-place op on them)
    device = rank_device()
    mesh, stage, opt = build(plan, device, lr, compile_backend)
    dp, pp, tp, cp, m = plan.dp, plan.pp, plan.tp, plan.cp, plan.microbatches
    d, s, c = mesh.get_local_rank("dp"), mesh.get_local_rank("pp"), mesh.get_local_rank("cp") if cp > 1 else 0
    tied = tied_group(mesh) if pp > 1 else None
    rows = BATCH // dp
    schedules = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}  # Plan allows these two
    schedule = schedules[plan.schedule](PipelineStage(stage, s, pp, device, group=mesh["pp"].get_group()),
                                   n_microbatches=m, loss_fn=loss_fn)
    extra = {"tied": tied} if tied is not None else {}
    if cp > 1 and dp > 1:  # FSDP2's group: dp x cp flattened (build); with dp = 1 it is the cp group itself
        extra["dp_cp"] = mesh["dp_cp"].get_group()
    out = dict(coords=(d, s, mesh.get_local_rank("tp")), losses=[], m=m, cp_rank=c)
    for step in range(steps):
        x, y = (t[d * rows:(d + 1) * rows] for t in make_batch(step))  # this dp rank's slice
        x, y = (t.to(device) for t in shard_batch(x, y, c, cp))  # and its tokens of each sequence (cp)
        opt.zero_grad()
        # the ledger (a TorchDispatchMode) only on the measured step: torch.compile does not trace under one
        ledger = MeshCommLedger(mesh, extra)
        dist.barrier()
        start = time.perf_counter()
        with ledger if step == measure_step else contextlib.nullcontext():
            mb_losses = []
            if pp == 1:
                schedule.step(x, target=y, losses=mb_losses)
            else:
                schedule.step(x) if s == 0 else schedule.step(target=y, losses=mb_losses) if s == pp - 1 else schedule.step()
            if tied is not None:  # sum the tied weight's two halves (first and last stage)
                w = stage.embed_tokens.weight if s == 0 else stage.lm_head.weight
                dist.all_reduce(_local(w.grad), group=tied)
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # CUDA runs ahead of Python: time the work, not its launch
        seconds = time.perf_counter() - start
        if step == 0:  # full gradients, gathered over dp and tp (outside the ledger)
            with full_tensor_unremarked():  # two all-gathers: torch's note on them is dropped (read why there)
                out["grads"] = {hf_name(n): _local(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
                                .clone() for n, p in stage.named_parameters()}
        loss = torch.stack(mb_losses).mean() if mb_losses else torch.zeros((), device=device)
        dist.all_reduce(loss, group=mesh["pp"].get_group())  # only the last stage had it
        dist.all_reduce(loss, group=mesh["dp"].get_group())  # mean over the dp slices
        if cp > 1:
            dist.all_reduce(loss, group=mesh["cp"].get_group())  # and over the cp ranks' tokens (as many each)
        out["losses"].append(loss.item() / (dp * cp))
        if step == measure_step:
            out.update(comm=ledger.summary(), seconds=seconds)
    out["memory"] = model_state_bytes(stage, opt)
    out["tensors"] = len(list(stage.parameters()))
    out["tp_sharded"] = {hf_name(n): isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements[-1:])
                         for n, p in stage.named_parameters()} if tp > 1 else {}
    return out


def reference(steps, lr=LR):
    """One process: the unmodified Hugging Face model (its own forward, causal mask, tied head) on the whole batch.

    Returns the losses of every step and the gradients of step 0, by parameter name."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, grads = [], None
    for step in range(steps):
        x, y = make_batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x).logits, y)
        loss.backward()
        grads = grads or {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, grads
