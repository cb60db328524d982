"""PyTorch Lightning and speed-ups (lessons 02 and 08): ``toy`` (``LitToy``, lesson 08's LightningModule,
importable by name for forked and spawned ranks, and the runs it makes), ``ddp_notebook`` (Lightning's
``ddp_notebook`` with ranks forked from a fresh process), ``quiet`` (no banners, no warnings the lessons cause
on purpose), ``compile_check`` (did ``torch.compile`` compile a DDP
model, and do its all-reduces still overlap backward), ``gpt_benchmark`` (a GPT-2-small-sized model timed on a GPU in
four precisions, with ``utils.perf``'s timing loop); for lesson 08c, ``accumulation`` (``accumulate_grad_batches``
and the all-reduces it saves under DDP), ``model_parallel`` (``ModelParallelStrategy`` with tensor parallelism in
``configure_model``) and ``gpu_strategies`` (``fsdp`` and ``deepspeed``: their GPU run, and Lightning's refusal on a
CPU).
"""
