"""Pipeline parallelism (lesson 06): ``schedules`` (schedules as op lists, GPipe, 1F1B, interleaved, their
simulator, the bubble formula and the plan checks; its names are re-exported here), ``timeline`` (a schedule
run on stage ranks with send/recv, every op timed, drawn as a Gantt chart), ``pipelining`` (the course model cut by
``torch.distributed.pipelining``'s tracer, and the loop lesson 06's ``torchrun`` script runs; notebook 06a),
``zero_bubble`` (the backward split into input and weight gradients, ZB-H1's order and bubble, torch's zero-bubble
schedules; notebook 06c).
"""

from .schedules import (SCHEDULES, Interval, PipelineDeadlock, bubble_at_cost, bubble_fraction, check_ranks,
                        gpipe_order, idle_fraction, microbatch_size, one_f_one_b_order, peak_in_flight,
                        schedule_orders, simulate, split_layers, start_shift)

__all__ = ["SCHEDULES", "Interval", "PipelineDeadlock", "bubble_at_cost", "bubble_fraction", "check_ranks",
           "gpipe_order", "idle_fraction", "microbatch_size", "one_f_one_b_order", "peak_in_flight",
           "schedule_orders", "simulate", "split_layers", "start_shift"]
