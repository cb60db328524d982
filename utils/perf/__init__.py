"""Performance measured one way for the whole course (most lessons: utils/perf/measure.py names them): ``measure`` (``stopwatch`` for one
interval, the one warm-up / synchronise / time loop, ``best_seconds`` for variants timed in turns, ``one_thread``),
``peaks`` (the data sheets' dense bf16 peaks in one table, and a peak measured with matmuls where no data sheet
applies), ``mfu`` (model FLOPs utilisation from tokens per second) and ``configs`` (the Llama of lessons 08d and 09
built from the planner's ``ModelShape``, so that the model timed and the FLOPs counted come from one description).
"""

from .configs import llama_config, llama_shape
from .measure import best_seconds, measure, one_thread, stopwatch, synchronize
from .mfu import mfu
from .peaks import PEAK_BF16, bf16_peak, matmul_peak, table_peak

__all__ = ["stopwatch", "measure", "best_seconds", "one_thread", "synchronize", "PEAK_BF16", "table_peak",
           "matmul_peak", "bf16_peak", "mfu", "llama_shape", "llama_config"]
