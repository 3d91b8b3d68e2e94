"""Per-example loss and correctness for each kind of task head."""

import tensorflow as tf


def per_example_loss(spec, targets, outputs):
    """Loss of each example, shape `(batch,)`, from the model's raw outputs."""
    outputs = tf.cast(outputs, tf.float32)
    if spec.head == "regression":
        return tf.reduce_mean(tf.square(outputs - tf.cast(targets, tf.float32)), axis=-1)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(targets, tf.int32), logits=outputs
    )
    if spec.head == "sequence":
        losses = tf.reduce_mean(losses, axis=-1)
    return losses


def per_example_correct(spec, targets, outputs):
    """How correct each example is, in [0, 1], shape `(batch,)`."""
    outputs = tf.cast(outputs, tf.float32)
    if spec.head == "regression":
        error = tf.abs(outputs - tf.cast(targets, tf.float32))
        return tf.reduce_mean(tf.cast(error < spec.tolerance, tf.float32), axis=-1)
    hits = tf.cast(
        tf.equal(tf.argmax(outputs, axis=-1, output_type=tf.int32), tf.cast(targets, tf.int32)),
        tf.float32,
    )
    if spec.head == "sequence":
        hits = tf.reduce_mean(hits[:, -spec.scored_steps :], axis=-1)
    return hits
