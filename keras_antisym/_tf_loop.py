"""The fused layers' time loop on TensorFlow outside training, in ops LiteRT has builtins for.

Keras' TensorFlow loop (`rnn_loop`, `keras_antisym/_keras_private.py`, assumption 1)
reserves its list of step outputs with the element shape `(None, units)`: in an
exported signature the batch is unknown, LiteRT's converter lowers a tensor list
to builtin ops only when it knows the element shape, and
`model.export(path, format="litert")` then needs the Flex delegate
(`FlexTensorListReserve`). This loop reserves its list with the call's batch, read
at run time (`tf.shape`), which the converter lowers (to a buffer it slices and
concatenates), and reads step `t`'s inputs with a gather: the whole loop is
builtin `WHILE`, `GATHER`, `SLICE`, `CONCATENATION` and the step's own ops, for any
batch and any length. tf2onnx still maps the list to the ONNX `Loop`'s scan output.
Without `return_all_outputs` no list is kept. The arithmetic is the layer's step
function; the semantics are `rnn_loop`'s (mask, `go_backwards`,
`zero_output_for_mask`, `return_all_outputs`), and it stays differentiable
(gradients of an inference call, as `keras_antisym.diagnostics` takes them).

The raw list ops (`tf.raw_ops.TensorList*`) because `tf.TensorArray` takes its
element shape as a static `TensorShape` only.

TensorFlow only, imported when the layer runs on it; training keeps Keras' loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Step = Callable[[Any, list[Any]], tuple[Any, list[Any]]]


def rnn_loop(
    step_function: Step,
    inputs: Any,
    initial_states: list[Any],
    output_size: int,
    go_backwards: bool = False,
    mask: Any = None,
    zero_output_for_mask: bool = False,
    return_all_outputs: bool = True,
) -> tuple[Any, Any, list[Any]]:
    """`keras_antisym._keras_private.rnn_loop`'s results for a batch-major `inputs`.

    Args:
        step_function: `(inputs_t, states) -> (output_t, new_states)`.
        inputs: `(batch, T, features)`, at least one step.
        initial_states: The states before the first step.
        output_size: The size of a step's output (of the first state's dtype).
        go_backwards: Process the steps last to first (the outputs in that order).
        mask: Optional `(batch, T)` booleans: a False step keeps the states and
            outputs the previous step's output (zeros with `zero_output_for_mask`).
        zero_output_for_mask: See `mask`.
        return_all_outputs: Whether `outputs` holds every step's output
            `(batch, T, size)` or only the last `(batch, 1, size)`.

    Returns:
        `(last_output, outputs, new_states)`.
    """
    import tensorflow as tf

    inputs = tf.convert_to_tensor(inputs)
    if go_backwards:
        inputs = tf.reverse(inputs, [1])
        mask = None if mask is None else tf.reverse(mask, [1])
    batch, steps = tf.shape(inputs)[0], tf.shape(inputs)[1]
    if mask is not None:
        mask = tf.cast(mask, tf.bool)
    states = tuple(tf.convert_to_tensor(state) for state in initial_states)
    dtype = states[0].dtype
    shape = tf.stack([batch, output_size])
    zeros = tf.zeros(shape, dtype)  # made once: the first "previous" output and the masked one
    # Every step's output in a list reserved for the run's batch (the last output only is
    # carried anyway).
    kept = () if not return_all_outputs else (
        tf.raw_ops.TensorListReserve(
            element_shape=shape, num_elements=steps, element_dtype=dtype
        ),
    )  # fmt: skip

    def body(t: Any, previous: Any, kept: Any, *states: Any) -> tuple[Any, ...]:
        output, new_states = step_function(tf.gather(inputs, t, axis=1), list(states))
        new_states = list(new_states)
        if mask is not None:
            on = tf.gather(mask, t, axis=1)[:, None]
            held = zeros if zero_output_for_mask else previous
            output = tf.where(on, output, held)
            pairs = zip(new_states, states, strict=True)
            new_states = [tf.where(on, new, old) for new, old in pairs]
        kept = tuple(
            tf.raw_ops.TensorListSetItem(input_handle=each, index=t, item=output) for each in kept
        )
        return (t + 1, output, kept, *new_states)

    _, last_output, kept, *new_states = tf.while_loop(
        lambda t, *_: t < steps,
        body,
        # No `maximum_iterations`: tf2onnx would type the ONNX loop's count apart.
        (tf.constant(0), zeros, kept, *states),
    )
    if not return_all_outputs:
        return last_output, last_output[:, None], list(new_states)
    stacked = tf.raw_ops.TensorListStack(
        input_handle=kept[0], element_shape=[-1, output_size], element_dtype=dtype
    )
    return last_output, tf.transpose(stacked, [1, 0, 2]), list(new_states)
