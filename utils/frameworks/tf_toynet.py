"""The course model in TensorFlow, and one data-parallel step written for any ``tf.distribute`` strategy.

Derived in lesson 13 (other frameworks), which runs the step under ``MirroredStrategy`` in the kernel
(notebook 13a) and ``MultiWorkerMirroredStrategy`` in worker processes (notebook 13b, ``notebooks/scripts/13_tf_worker.py``): both
need the same model and the same step, so they live here, once.

``TFToyNet`` is ``utils.ToyNet`` (notebook 02) written with ``tf.Variable``s and built from a torch
``state_dict``, so both frameworks start from the *same* numbers:

- the frozen parameter ``input_scale`` and the buffer ``input_shift`` are variables with
  ``trainable=False``: TensorFlow has no separate word for a buffer;
- the tied weight is ONE variable, ``mix.weight``, used by both mixing layers, so its gradient is the
  sum of both uses, as in torch;
- a torch ``Linear`` stores its weight as (out, in) and computes ``x @ W.T``; here each weight is
  stored transposed, (in, out), and the layer is ``x @ W``.

TensorFlow is imported inside the functions: importing ``utils`` never needs it.
"""

import numpy as np

__all__ = ["TRAINABLE", "TFToyNet", "dp_step", "shard_of", "single_device_step"]

# torch's model.parameters() order, trainable ones only; the tied mix2.weight is mix1.weight, listed once
TRAINABLE = ["embed.weight", "embed.bias", "mix1.weight", "mix1.bias", "mix2.bias", "head.weight", "head.bias"]


def TFToyNet(state):
    """A ``tf.Module`` with ToyNet's forward, its variables copied from a torch ``state_dict`` (tensors or arrays).

    Create it inside ``strategy.scope()`` to get one mirrored copy of every variable per replica."""
    import tensorflow as tf

    class _TFToyNet(tf.Module):
        def __init__(self):
            super().__init__(name="toynet")
            arr = {k: np.asarray(v, dtype=np.float32) for k, v in state.items()}
            # ONLY_FIRST_REPLICA: every replica assigns the same all-reduced update; take replica 0's once.
            var = lambda a, trainable=True: tf.Variable(a, trainable=trainable,
                                                        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.input_scale = var(arr["input_scale"], trainable=False)  # the frozen parameter
            self.input_shift = var(arr["input_shift"], trainable=False)  # the buffer
            self.params = {  # torch name -> variable, in torch's order; weights transposed to (in, out)
                name: var(arr[name].T if name.endswith("weight") else arr[name]) for name in TRAINABLE}

        def __call__(self, x):  # (batch, 64) -> (batch, 10) logits, exactly ToyNet.forward
            p = self.params
            x = (x - self.input_shift) * self.input_scale
            h = tf.tanh(x @ p["embed.weight"] + p["embed.bias"])  # (batch, hidden)
            h = h + tf.tanh(h @ p["mix1.weight"] + p["mix1.bias"])  # the tied weight, first use
            h = h + tf.tanh(h @ p["mix1.weight"] + p["mix2.bias"])  # ... and second use
            return h @ p["head.weight"] + p["head.bias"]

        def torch_state(self):
            """The trainable weights as numpy arrays in torch's layout (weights back to (out, in))."""
            return {n: v.numpy().T if n.endswith("weight") else v.numpy() for n, v in self.params.items()}

    return _TFToyNet()


def _loss_and_grads(model, x, y, global_batch):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x))  # (b,)
        loss = tf.nn.compute_average_loss(per_sample, global_batch_size=global_batch)  # sum / GLOBAL batch
    return loss, tape.gradient(loss, list(model.params.values()))


def single_device_step(model, x, y, lr):
    """One plain SGD step on the whole batch, one device: the reference. Returns (loss, grads in torch layout)."""
    loss, grads = _loss_and_grads(model, x, y, global_batch=len(x))
    for v, g in zip(model.params.values(), grads):
        v.assign_sub(lr * g)
    return float(loss), _torch_layout(grads)


def shard_of(x, ctx):
    """Replica r of n takes samples r, r+n, r+2n, ... of the global batch: lesson 02's ``local_batch``."""
    return x[ctx.replica_id_in_sync_group::ctx.num_replicas_in_sync]


def dp_step(strategy, model, x, y, lr):
    """One synchronous data-parallel SGD step on the global batch (x, y) under ``strategy``.

    Returns (global loss, [all-reduced grads of replica r in torch layout, for each local replica r])."""
    import tensorflow as tf

    global_batch = len(x)
    xs = strategy.experimental_distribute_values_from_function(lambda ctx: shard_of(x, ctx))
    ys = strategy.experimental_distribute_values_from_function(lambda ctx: shard_of(y, ctx))

    def replica_step(x, y):  # runs once per replica, on its own shard (B/n samples)
        loss, grads = _loss_and_grads(model, x, y, global_batch)  # this shard's sum / B
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)  # sum over replicas = the mean over B
        for v, g in zip(model.params.values(), grads):
            v.assign_sub(lr * g)  # the same SGD step on every replica
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, loss), grads

    loss, grads = tf.function(lambda: strategy.run(replica_step, args=(xs, ys)))()
    per_replica = [_torch_layout(g) for g in zip(*(strategy.experimental_local_results(t) for t in grads))]
    return float(strategy.experimental_local_results(loss)[0]), per_replica


def _torch_layout(grads):
    return {n: g.numpy().T if n.endswith("weight") else g.numpy() for n, g in zip(TRAINABLE, grads)}
