"""The `serving_default` and `stream` graphs as TensorFlow functions with one `tf.while_loop`.

LiteRT (`serving.exports.litert`) and tf2onnx (`serving.exports.onnxgraphs`) convert these:
the loop becomes LiteRT's builtin `WHILE` and ONNX's `Loop`, and each step
is the model's `StepProgram` (`serving.exports.steploop`), whose ops (matrix
products, `tanh`, `sigmoid`, additions) are builtins of both. Weights are
constants in the graph.

* `serving_default`: `sequence` `(batch, T, m)` with T the model's own (any T
  for a model built with `T=None`), the loop from zero states, the head's
  outputs as the SavedModel's `serving_default` names them;
* `stream`: `sequence` `(batch, t, m)` for any t >= 1 and one `(batch, units)`
  input per state, the head's outputs after the chunk and the new states.

A model that cannot stream (`serving.exports.signatures.stream_plan` says why) gets
no `stream` and a `serving_default` of Keras' own graph, which converts only
when it has no recurrent loop.

Only the exports import this module; it imports TensorFlow when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from apputil.quiet import import_tensorflow
from serving.exports.signatures import StreamPlanError, head_outputs
from serving.exports.steploop import FrozenWeights, StepProgram, step_program
from serving.names import DEFAULT_SIGNATURE, SEQUENCE_INPUT, STREAM_SIGNATURE

if TYPE_CHECKING:
    import keras


@dataclass
class Graphs:
    """The functions to convert, `{signature: tf.function}`, and why `stream` is missing."""

    functions: dict[str, Any]
    stream_missing: str | None = None


class StepOutputs(Protocol):
    """How the loop keeps a per-step program's outputs: the converter picks it.

    Growing a loop-carried tensor by one step per iteration (a concatenation)
    copies the steps so far at every step; each form here writes each step's
    output once, in an op the converter has a lowering for.
    """

    def start(self, batch: Any, total: Any, size: int) -> Any:
        """The loop-carried value before the first step."""

    def put(self, kept: Any, t: Any, y: Any) -> Any:
        """`kept` with `y` `(batch, size)` as step `t`."""

    def stacked(self, kept: Any) -> Any:
        """The outputs `(batch, T, size)`."""


class UpdatedSlices:
    """A `(batch, T, size)` tensor made before the loop, each step written into it, for
    LiteRT: XLA's dynamic update slice is LiteRT's builtin `DYNAMIC_UPDATE_SLICE`, and a
    `TensorArray` would need TensorList ops, which LiteRT has no builtins for. (LiteRT's
    `WHILE` still copies the tensor from one iteration to the next.)"""

    def start(self, batch: Any, total: Any, size: int) -> Any:
        return import_tensorflow().zeros([batch, total, size])

    def put(self, kept: Any, t: Any, y: Any) -> Any:
        tf = import_tensorflow()
        return dynamic_update_slice(kept, y[:, None], tf.stack([0, t, 0]))

    def stacked(self, kept: Any) -> Any:
        return kept


class TensorArrays:
    """A `TensorArray`, for tf2onnx: it becomes the `Loop`'s scan output, which ONNX
    Runtime collects without copying the steps so far (XLA's update slice has no tf2onnx
    handler)."""

    def start(self, batch: Any, total: Any, size: int) -> Any:
        tf = import_tensorflow()
        element = tf.TensorShape([None, size])
        return tf.TensorArray(tf.float32, size=total, element_shape=element)

    def put(self, kept: Any, t: Any, y: Any) -> Any:
        return kept.write(t, y)

    def stacked(self, kept: Any) -> Any:
        return import_tensorflow().transpose(kept.stack(), [1, 0, 2])


def dynamic_update_slice(operand: Any, update: Any, start: Any) -> Any:
    """`operand` with `update` written at `start` (XLA's `DynamicUpdateSlice`).

    The op has no public TensorFlow API (not even in `tf.raw_ops`); its Python
    wrapper lives in `tensorflow.compiler.tf2xla`, imported here only.
    """
    from tensorflow.compiler.tf2xla.python import xla

    return xla.dynamic_update_slice(operand, update, start)


def run_loop(
    program: StepProgram, sequence: Any, states: list[Any], outputs: StepOutputs
) -> tuple[Any, list[Any]]:
    """`program` over every step of `sequence` (at least one) from `states`:
    `(outputs, new states)`.

    `outputs` keeps a per-step program's outputs; otherwise the loop carries the
    last step's.
    """
    tf = import_tensorflow()
    batch, total = tf.shape(sequence)[0], tf.shape(sequence)[1]
    size = program.output_size
    # Every loop-carried value keeps its shape from one step to the next (the batch and
    # the length unknown from the start), so the loop needs no shape invariants.
    initial = outputs.start(batch, total, size) if program.per_step else tf.zeros([batch, size])

    def body(t: Any, kept: Any, *carried: Any) -> tuple[Any, ...]:
        # A gather, not a strided slice: one op in LiteRT and ONNX instead of a dozen.
        y, new_states = program.step(tf.expand_dims(tf.gather(sequence, t, axis=1), 1), carried)
        return (t + 1, outputs.put(kept, t, y) if program.per_step else y, *new_states)

    with program.sequence():  # the transition matrices: loop invariants, formed once
        _, kept, *finals = tf.while_loop(
            lambda t, *_: t < total, body, [tf.constant(0), initial, *states]
        )
    final = outputs.stacked(kept) if program.per_step else kept
    return program.finish(final), finals


def graphs(
    model: keras.Model,
    head: str,
    outputs: StepOutputs,
    stream: bool = True,
    state_output: Callable[[str], str] = lambda name: name,
) -> Graphs:
    """The `tf.function`s of `model`'s signatures, with their input signatures bound.

    Args:
        model: A Keras model on the TensorFlow backend, float32, one
            `(batch, T, m)` input.
        head: The head (`serving.exports.heads.HEAD_NAMES`) naming the outputs.
        outputs: How the loop keeps a per-step head's outputs (the converter's
            `StepOutputs`).
        stream: Boolean, build `stream` if the model can stream.
        state_output: The output name of each new state, from its input's
            name (ONNX needs names distinct from the inputs').
    """
    tf = import_tensorflow()
    shape = tuple(model.inputs[0].shape)
    steps, features = shape[1], shape[2]
    frozen = FrozenWeights(model)
    try:
        program: StepProgram | None = step_program(model)
        missing = None
    except StreamPlanError as error:
        program, missing = None, str(error)
    sequence_spec = tf.TensorSpec([None, steps, features], tf.float32, name=SEQUENCE_INPUT)

    def whole(sequence: Any) -> dict[str, Any]:
        with frozen.constants(tf.constant):
            if program is None:
                result = model(sequence, training=False)
            else:
                batch = tf.shape(sequence)[0]
                zeros = [tf.zeros([batch, units]) for units in program.states.values()]
                result, _ = run_loop(program, sequence, zeros, outputs)
            return head_outputs(result, head)

    whole_function = tf.function(whole, input_signature=[sequence_spec], autograph=False)
    functions = {DEFAULT_SIGNATURE: whole_function}
    if stream and program is not None:
        names = {name: state_output(name) for name in program.states}
        chunk_spec = tf.TensorSpec([None, None, features], tf.float32, name=SEQUENCE_INPUT)
        state_specs = [
            tf.TensorSpec([None, units], tf.float32, name=name)
            for name, units in program.states.items()
        ]
        stream_program = program

        def chunk(sequence: Any, *states: Any) -> dict[str, Any]:
            with frozen.constants(tf.constant):
                result, finals = run_loop(stream_program, sequence, list(states), outputs)
                named = dict(zip(names.values(), finals, strict=True))
                return {**head_outputs(result, head), **named}

        functions[STREAM_SIGNATURE] = tf.function(
            chunk, input_signature=[chunk_spec, *state_specs], autograph=False
        )
    return Graphs(functions, missing if stream else None)
