"""The 3-D mesh (lesson 09, lab 09): ``mesh3d`` (the dp x pp x tp meshes of a world size, collectives filed by mesh
dimension, the bytes of local shards), ``plan3d`` (the tiny Llama's sizes and a run of it as one ``utils.planner.Plan``,
checked once by the planner), ``parallelize3d`` (the model split into stages, tensor-parallel and FSDP2-sharded on the
plan's mesh, trained, and its one-process reference), ``context4d`` (context parallelism as a fourth dimension,
lesson 14), ``mfu`` (a bf16 compiled Llama's model FLOPs utilisation on one rank, measured with ``utils.perf``).
"""
