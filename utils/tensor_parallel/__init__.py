"""Tensor parallelism (lesson 05: notebooks 05a and 05b), one file per piece, as picotron keeps its
``tp_communications.py`` beside its tensor-parallel wrapper:

- ``degrees``: which degrees fit a model; ``check_tp_degree`` refuses the others at once, naming the numbers;
- ``communications``: Megatron's ``f`` and ``g`` (05a; lesson 12's graph rewrite imports them);
- ``sequence_parallel``: the all-gather and reduce-scatter that replace them along the sequence (05b);
- ``transformer``: the plain transformer layer the lesson splits (05a);
- ``layers``: the column- and row-parallel linear layers and ``tensor_parallel``, the plan applied from outside (05a);
- ``compare``: a tensor-parallel model against the unsplit one, outputs and every gradient (05a, 05b);
- ``toy_plan``: Megatron's split of the course's ``ToyNet`` as a ``parallelize_module`` plan, the tied weight kept (08c).

Their names are re-exported here: ``from utils.tensor_parallel import check_tp_degree, tensor_parallel``.
"""

from .compare import compare, full_slice
from .degrees import check_tp_degree, nearest_tp_degrees, valid_tp_degrees
from .layers import ColumnParallelLinear, RowParallelLinear, tensor_parallel
from .toy_plan import apply_toy_tp, toy_tp_plan
from .transformer import MLP, Attention, TransformerLayer, transformer_stack

__all__ = ["check_tp_degree", "nearest_tp_degrees", "valid_tp_degrees", "ColumnParallelLinear", "RowParallelLinear",
           "tensor_parallel", "Attention", "MLP", "TransformerLayer", "transformer_stack", "compare", "full_slice",
           "apply_toy_tp", "toy_tp_plan"]
