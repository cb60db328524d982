"""The ``%%ranks N`` cell magic: run a notebook cell on N ranks, as if N notebooks ran it at once.

Load it once with ``%load_ext utils``, then::

    %%ranks 4 --return total
    t = torch.tensor([float(rank)])      # rank, world_size and device are set for you
    dist.all_reduce(t)
    total = t.item()

prints each rank's output prefixed ``[rank k]`` and leaves ``total`` in the kernel as a list of
four values, one per rank. Under the hood the cell body becomes a function handed to
``utils.launch.run_ranks`` (notebook 00 shows both ways side by side).

Each rank starts from a copy of the kernel's variables (the ranks are forked), so functions,
classes and tensors defined in earlier cells are there. Assignments in the cell stay on the rank;
only the names after ``--return`` come back. When CUDA is already initialised in the kernel the
ranks are spawned instead, and only the variables the cell uses travel to them (by cloudpickle).
"""

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

import torch

from .launch import DEFAULT_TIMEOUT, rank_device, run_ranks


def _run_cell_on_rank(code, filename, names_back, shipped):
    """Runs on every rank: execute the cell's code and return the asked-for variables."""
    import torch.distributed as dist

    if shipped is None:  # forked: the rank's own copy of the kernel namespace
        from IPython import get_ipython

        namespace = get_ipython().user_ns
    else:  # spawned: a fresh interpreter, only the variables the cell uses came along
        namespace = dict(shipped)
    namespace.update(rank=dist.get_rank(), world_size=dist.get_world_size(), device=rank_device())
    exec(compile(code, filename, "exec"), namespace)
    missing = [n for n in names_back if n not in namespace]
    if missing:
        raise NameError(f"--return asked for {missing}, which the cell did not define on rank {dist.get_rank()}.")
    return {n: namespace[n] for n in names_back}


def _names_used(code_object):
    """Every global name a piece of code (and the functions inside it) refers to."""
    names = set(code_object.co_names)
    for const in code_object.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_used(const)
    return names


@magics_class
class RanksMagics(Magics):
    @magic_arguments()
    @argument("world_size", type=int, help="number of ranks (CPU processes over gloo, or GPUs over NCCL)")
    @argument("-t", "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds before the ranks are stopped")
    @argument("-b", "--backend", default="auto", choices=["auto", "gloo", "nccl"], help="communication backend")
    @argument("-r", "--return", dest="names", nargs="+", default=[], metavar="NAME",
              help="variables to bring back into the kernel, each as a list with one value per rank")
    @argument("-q", "--quiet", action="store_true", help="do not print the launch plan")
    @cell_magic
    def ranks(self, line, cell):
        """Run this cell on N ranks: ``%%ranks N [--timeout S] [--backend B] [--return NAME ...]``."""
        __tracebackhide__ = True
        args = parse_argstring(self.ranks, line)
        shell = self.shell
        code = shell.transform_cell(cell)  # so %magics and !commands inside the cell work too
        filename = shell.compile.cache(code)  # registers the source, so tracebacks show the cell's lines
        shipped = None
        if torch.cuda.is_initialized():  # run_ranks will spawn: send the variables the cell uses
            used = _names_used(compile(code, filename, "exec"))
            shipped = {n: shell.user_ns[n] for n in used if n in shell.user_ns and not n.startswith("_")}
        results = run_ranks(_run_cell_on_rank, code, filename, args.names, shipped, world_size=args.world_size,
                            timeout=args.timeout, backend=args.backend, verbose=not args.quiet)
        for name in args.names:
            shell.user_ns[name] = [r[name] for r in results]
