"""Lightning without the output a lesson does not explain (lessons 02b and 08): ``quiet_lightning``.

Called in the kernel by the lessons, and by ``ddp_notebook`` in the fresh process it forks the ranks from: a
logger's level and a warning filter belong to one process, and that process is a fork of the rank server, not of
the kernel.
"""

import logging
import warnings

__all__ = ["quiet_lightning"]


def quiet_lightning():
    """No "GPU available: False" banners, and no warnings about choices the lesson makes on purpose.

    Lightning's banners, its "Initializing distributed" and "LOCAL_RANK" lines, the model summary and its
    "`Trainer.fit` stopped" note are INFO records of the ``lightning.pytorch`` and ``lightning.fabric`` loggers
    (``rank_zero_info``, ``log.info``; Lightning sets both loggers to INFO on import): both go to WARNING, so those
    go and Lightning's logged warnings (a failed SLURM requeue, signal_connector) and errors still show. Its other
    warnings go through ``warnings.warn`` and all show, but two: ``num_workers=0`` is deliberate in most runs (the data
    are tensors in memory), and ``LeafSpec`` is a deprecation inside Lightning's own code, which no learner can fix.
    Call it once per process.
    """
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
