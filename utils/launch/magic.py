"""The ``%%ranks N`` cell magic: run a notebook cell on N ranks, as if N notebooks ran it at once.

Load it once with ``%load_ext utils``, then::

    %%ranks 4 --return total
    t = torch.tensor([float(rank)])      # rank, world_size and device are set for you
    dist.all_reduce(t)
    total = t.item()

prints each rank's output prefixed ``[rank k]`` and leaves ``total`` in the kernel as a list of
four values, one per rank. Under the hood the cell's code becomes the function handed to
``run_ranks`` (``kernel.py``; notebook 00 shows both ways side by side).

The ranks see the kernel's variables that the cell uses: those travel to them by value
(cloudpickle), functions and classes defined in earlier cells included. Assignments in the cell
stay on the rank; only the names after ``--return`` come back.
"""

import cloudpickle
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .kernel import DEFAULT_TIMEOUT, run_ranks
from .rank import rank_device


def _run_cell_on_rank(code, filename, names_back, shipped):
    """Runs on every rank: execute the cell's code and return the asked-for variables."""
    import torch.distributed as dist

    namespace = dict(shipped, __name__="__main__")
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


def _variables_for(code_object, user_ns):
    """The kernel's variables the cell uses, each checked to travel (a clear error names any that cannot)."""
    shipped = {}
    for name in sorted(_names_used(code_object)):
        if name in user_ns and not name.startswith("_"):
            try:
                cloudpickle.dumps(user_ns[name])
            except Exception as exc:  # noqa: BLE001
                raise TypeError(f"the cell uses {name!r} ({type(user_ns[name]).__name__}), which cannot be sent to "
                                f"the ranks: {exc}. Create it inside the cell instead.") from None
            shipped[name] = user_ns[name]
    return shipped


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
        shipped = _variables_for(compile(code, filename, "exec"), shell.user_ns)
        results = run_ranks(_run_cell_on_rank, code, filename, args.names, shipped, world_size=args.world_size,
                            timeout=args.timeout, backend=args.backend, verbose=not args.quiet)
        for name in args.names:
            shell.user_ns[name] = [r[name] for r in results]
