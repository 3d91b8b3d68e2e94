"""Per-example loss and correctness for each kind of task head (`keras.ops`: any backend)."""

from keras import ops

from training.tasks.heads import HEADS


def per_example_loss(spec, targets, outputs):
    """Loss of each example, shape `(batch,)`, from the model's raw outputs."""
    head = HEADS[spec.head]
    outputs = ops.cast(outputs, "float32")
    if head.regression:
        return ops.mean(ops.square(outputs - ops.cast(targets, "float32")), axis=-1)
    losses = ops.sparse_categorical_crossentropy(
        ops.cast(targets, "int32"), outputs, from_logits=True
    )
    if head.per_step:
        losses = ops.mean(losses, axis=-1)
    return losses


def per_example_correct(spec, targets, outputs):
    """How correct each example is, in [0, 1], shape `(batch,)`."""
    head = HEADS[spec.head]
    outputs = ops.cast(outputs, "float32")
    if head.regression:
        error = ops.abs(outputs - ops.cast(targets, "float32"))
        return ops.mean(ops.cast(error < spec.tolerance, "float32"), axis=-1)
    hits = ops.cast(
        ops.equal(ops.cast(ops.argmax(outputs, axis=-1), "int32"), ops.cast(targets, "int32")),
        "float32",
    )
    if head.per_step:
        hits = ops.mean(hits[:, -spec.scored_steps :], axis=-1)
    return hits
