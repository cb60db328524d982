"""Parallelism as a graph transformation (lesson 12): ``cost`` (a cost model read off a ``torch.fx`` graph and the
balanced pipeline split it gives), ``passes`` (Megatron's MLP split as a rewrite of a traced graph).
"""
