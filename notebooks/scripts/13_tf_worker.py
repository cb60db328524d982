"""One worker of lesson 13b's MultiWorkerMirroredStrategy job: one process, one replica, ring all-reduce.

Notebook 13 starts WORLD_SIZE copies of this script, each with its own TF_CONFIG (the cluster's
addresses and which task this process is), as a cluster scheduler would:

    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:12346"]}, "task": {"type": "worker", "index": 0}}' \\
        python 13_tf_worker.py --inputs in.npz --out worker0.npz --lr 0.5

Every worker reads the same initial weights and global batch from ``--inputs`` (written by the
notebook), takes its shard of the batch (replica r: samples r, r+n, ...), runs one data-parallel SGD
step (``utils.frameworks.tf_toynet.dp_step``, the same function the notebook runs under MirroredStrategy) and
writes its all-reduced gradients, its weights after the step and the global loss to ``--out``.
"""

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter, before the import
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for utils

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from utils.frameworks.tf_toynet import TFToyNet, dp_step  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", required=True, help="npz: the torch state_dict's arrays, x and y of the global batch")
    parser.add_argument("--out", required=True, help="npz written by this worker")
    parser.add_argument("--lr", type=float, required=True)
    args = parser.parse_args()
    if "TF_CONFIG" not in os.environ:
        sys.exit("TF_CONFIG is not set: it names the cluster's workers and this process's index (see the docstring)")
    task = json.loads(os.environ["TF_CONFIG"])["task"]

    tf.config.threading.set_intra_op_parallelism_threads(1)  # n workers share the machine's cores
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # RING: the all-reduce is lesson 01's ring over gRPC (NCCL would be the choice on GPUs; AUTO picks for you)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)  # reads TF_CONFIG

    data = dict(np.load(args.inputs))
    x, y = data.pop("x"), data.pop("y")
    with strategy.scope():
        model = TFToyNet(data)  # the remaining arrays are the torch state_dict
    loss, grads = dp_step(strategy, model, x, y, args.lr)
    (local,) = grads  # one replica per worker process
    np.savez(args.out, loss=loss, replicas=strategy.num_replicas_in_sync, index=task["index"],
             **{f"grad/{k}": v for k, v in local.items()},
             **{f"weight/{k}": v for k, v in model.torch_state().items()})


if __name__ == "__main__":
    main()
