"""Data parallelism (lessons 02 and 03, labs 02 and 03): ``buckets`` (which gradients are reduced together, by the
rule of torch DDP or of DeepSpeed's ZeRO).
"""
