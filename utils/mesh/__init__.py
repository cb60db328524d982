"""The 3-D mesh (lesson 09, lab 09): ``mesh3d`` (a dp x pp x tp ``DeviceMesh`` checked against the model, collectives
filed by mesh dimension, the bytes of local shards), ``parallelize3d`` (the tiny Llama split into stages,
tensor-parallel and FSDP2-sharded on the mesh, trained, and its one-process reference), ``mfu`` (a bf16 compiled Llama's
model FLOPs utilisation on one rank, measured with ``utils.perf``).
"""
