"""Low-precision training numerics (lesson 08d, ``notebooks/08d_fp8_numerics.ipynb``): ``fp8`` (the two FP8
formats, scales per tensor or per row, the amax history of delayed scaling, and a Float8 linear layer whose FP8
matmuls are simulated in fp32), ``fp8_training`` (the course model trained a few steps in each recipe, and
torchao's float8 training of lesson 09b's MFU Llama timed on a GPU).
"""
