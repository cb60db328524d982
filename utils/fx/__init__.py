"""Parallelism as a graph transformation (lesson 12, in two parts: notebooks/12a_fx_trace_and_cost.ipynb and
notebooks/12b_fx_rewrite_and_export.ipynb): ``tiny_gpt`` (the model both parts trace: lesson 05's transformer layer
stacked behind an embedding), ``cost`` (a cost model read off a ``torch.fx`` graph and the balanced pipeline split it
gives, 12a), ``passes`` (Megatron's MLP split as a rewrite of a traced graph, 12b).
"""
