"""Data parallelism (lessons 02a, 02b and 03, labs 02 and 03): ``scratch`` (lesson 02's DDP from scratch: the
one-process reference, the broadcast and the gradient all-reduce), ``buckets`` (which gradients are reduced together,
by the rule of torch DDP or of DeepSpeed's ZeRO), ``overlap`` (torch DDP's buckets launched during backward, timed on
every rank; lesson 02a).
"""
