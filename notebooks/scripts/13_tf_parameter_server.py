"""Lesson 13b's parameter-server cluster, all in one process: N workers, one ps, and the coordinator.

    python 13_tf_parameter_server.py --workers 2 --inputs in.npz --out ps.npz --lr 0.5

A real cluster runs each task in its own process or machine (each with a TF_CONFIG naming its job);
TensorFlow's own tutorial starts the worker and ps servers inside the coordinator's process, as here,
which is enough to see where the variables live and what the workers do. Two runs from the same
initial weights (``--inputs``: the torch state_dict's arrays, x and y of the global batch):

1. synchronous by hand: every worker computes its shard's gradient (replica r: samples r, r+n, ...,
   loss scaled by the GLOBAL batch) at the same weights; the coordinator sums them and applies one
   SGD step;
2. one update per worker, in turn: worker r computes its shard's gradient on the weights the
   previous worker left and applies it at once (lr / n: its loss is a mean over its own shard).

Saves the summed gradients (``grad/``), the weights after run 1 (``sync/``) and after run 2
(``in_turn/``), in torch's layout.
"""

import argparse
import os
import socket
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for utils

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from utils.frameworks.tf_toynet import TRAINABLE, TFToyNet  # noqa: E402


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def in_process_cluster(workers, ps=1):
    """Start the worker and ps servers in this process; return a resolver the coordinator connects with."""
    ports = free_ports(workers + ps)
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{p}" for p in ports[:workers]],
                                 "ps": [f"localhost:{p}" for p in ports[workers:]]})
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=workers + 1)  # enough threads on a small CPU
    for i in range(workers):
        tf.distribute.Server(spec, job_name="worker", task_index=i, config=config, protocol="grpc")
    for i in range(ps):
        tf.distribute.Server(spec, job_name="ps", task_index=i, protocol="grpc")
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--lr", type=float, required=True)
    args = parser.parse_args()
    n = args.workers

    strategy = tf.distribute.ParameterServerStrategy(in_process_cluster(n))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    data = dict(np.load(args.inputs))
    x, y = data.pop("x"), data.pop("y")
    shards = [(tf.constant(x[r::n]), tf.constant(y[r::n])) for r in range(n)]

    def build():
        with strategy.scope():
            return TFToyNet(data)  # its variables are created on the ps task

    def shard_gradient(model, xs, ys, global_batch):
        with tf.GradientTape() as tape:
            per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ys, logits=model(xs))
            loss = tf.reduce_sum(per_sample) / global_batch
        return tape.gradient(loss, list(model.params.values()))

    # 1. synchronous by hand: n closures at the same weights, summed by the coordinator, one step
    model = build()
    print("variables live on:", sorted({v.device for v in model.params.values()}))
    grad_fn = tf.function(lambda xs, ys: shard_gradient(model, xs, ys, len(x)))
    remote = [coordinator.schedule(grad_fn, args=shards[r]) for r in range(n)]  # the coordinator picks a free worker
    coordinator.join()
    summed = [sum(parts) for parts in zip(*(r.fetch() for r in remote))]  # fetch: numpy arrays
    for v, g in zip(model.params.values(), summed):
        v.assign_sub(args.lr * g)
    sync = model.torch_state()

    # 2. one update per worker, in turn: worker r's gradient on the weights worker r-1 left behind
    model = build()

    @tf.function
    def update(xs, ys):
        grads = shard_gradient(model, xs, ys, len(xs))  # the mean over this worker's own shard
        for v, g in zip(model.params.values(), grads):
            v.assign_sub(args.lr / n * g)  # applied at once, on the ps: no waiting for the other workers
        return tf.constant(0)

    for r in range(n):
        coordinator.schedule(update, args=shards[r])
        coordinator.join()  # in turn: the next worker starts only once this update has landed
    in_turn = model.torch_state()

    layout = lambda name, g: g.T if name.endswith("weight") else g
    np.savez(args.out, **{f"grad/{k}": layout(k, np.asarray(g)) for k, g in zip(TRAINABLE, summed)},
             **{f"sync/{k}": v for k, v in sync.items()}, **{f"in_turn/{k}": v for k, v in in_turn.items()})
    print(f"cluster: {n} workers + 1 ps + this coordinator, in one process")


if __name__ == "__main__":
    main()
