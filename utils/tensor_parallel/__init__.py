"""Tensor parallelism (lesson 05): ``degrees`` (which degrees fit a model; ``check_tp_degree`` refuses the
others at once, naming the numbers). Its names are re-exported here: ``from utils.tensor_parallel import
check_tp_degree``.
"""

from .degrees import check_tp_degree, nearest_tp_degrees, valid_tp_degrees

__all__ = ["check_tp_degree", "nearest_tp_degrees", "valid_tp_degrees"]
