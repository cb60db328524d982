"""Data parallelism (lessons 02a, 02b and 03, labs 02 and 03): ``scratch`` (lesson 02's DDP from scratch: the
broadcast and the gradient all-reduce), ``torch_ddp`` (torch DDP with lesson 02's Python all-reduce hook, and the loop
lesson 02's ``torchrun`` script runs; its global loss and progress line serve lessons 04's and 06's loops too),
``buckets`` (which gradients are reduced together, by the rule of torch DDP or of DeepSpeed's ZeRO), ``overlap`` (torch
DDP's buckets launched during backward, timed on every rank; lesson 02a). The one-process reference they are checked
against is the course model's: ``utils.models.train_reference``.
"""
