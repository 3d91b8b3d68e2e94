"""The `stream` and `padded` signatures: a model's layers walked with explicit states and masks.

TensorFlow Serving keeps no state between requests, so a long sequence is
served chunk by chunk with the recurrent states passed in and out of each
request (`stream`), and sequences of different lengths share a batch through
a `length` input that masks the padding (`padded`). Both are built by walking
the model's layers in order:

* a recurrent layer (`keras.layers.RNN` and its subclasses: AntisymmetricRNN,
  GatedAntisymmetricRNN, SimpleRNN, GRU, LSTM, `RNN(cell)`) is called with
  `initial_state=` and returns its new states too (`stream`), or with the
  mask of the valid steps (`padded`);
* a per-step layer (`PER_STEP_LAYERS`: Dense, Dropout, LayerNormalization,
  TimeDistributed, ...) is called as it is: it treats every time step alone,
  so it gives the same answer on a chunk as on the whole sequence;
* once a recurrent layer has returned only its last output, the time axis is
  gone: the layers after it (the head) are called as they are on that output.

Anything else on the time axis (attention or pooling over the sequence,
convolutions, Bidirectional and `go_backwards` for `stream`, layers this
module does not know) makes the signature impossible; `stream_plan` and
`padded_plan` then return the one-line reason instead of a plan, and the
export goes on without that signature.

Only the export imports this module; it imports Keras when called.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from apputil.quiet import import_tensorflow
from serving.names import LENGTH_INPUT, SEQUENCE_INPUT, STATE_PREFIX
from training.tasks.heads import HEADS

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

# Layers that treat each time step on its own (by class name, from keras.layers),
# so that a chunk gives the same answer as the whole sequence. Their axis, where
# they have one, must be the feature axis (`_per_step_reason`).
PER_STEP_LAYERS = frozenset(
    {
        "Dense",
        "Dropout",
        "SpatialDropout1D",
        "GaussianNoise",
        "GaussianDropout",
        "AlphaDropout",
        "ActivityRegularization",
        "Activation",
        "ReLU",
        "LeakyReLU",
        "ELU",
        "Softmax",
        "LayerNormalization",
        "BatchNormalization",
        "UnitNormalization",
        "TimeDistributed",
        "Identity",
        "Rescaling",
    }
)


class StreamPlanError(ValueError):
    """Why a model cannot have a `stream` or `padded` signature (one line)."""


@dataclass
class Step:
    """One layer of the walk: `kind` is "recurrent", "per_step" or "head"."""

    layer: Any
    kind: str
    state_names: list[str] = field(default_factory=list)
    state_sizes: list[int] = field(default_factory=list)


@dataclass
class Plan:
    """The layers of a model in call order, and the state inputs of its recurrent layers."""

    steps: list[Step]

    @property
    def states(self) -> dict[str, int]:
        """`{state input name: units}` in layer order (LSTM: h then c)."""
        return {
            name: size
            for step in self.steps
            for name, size in zip(step.state_names, step.state_sizes, strict=True)
        }


def _describe(layer: Any) -> str:
    return f"layer {layer.name!r} ({type(layer).__name__})"


def _chain(model: keras.Model) -> list[Any]:
    """The model's layers, when each one takes the previous one's output (else raises)."""
    keras = _keras()
    if not isinstance(model, keras.Model):
        raise StreamPlanError(
            f"a {type(model).__module__.split('.')[0]} model is not a Keras 3 model: the "
            f"signatures walk Keras 3 layers (see docs/legacy.md)"
        )
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if not layers:
        raise StreamPlanError("the model has no layers")
    if isinstance(model, keras.Sequential):
        return layers
    try:
        previous = model.inputs[0]
        for layer in layers:
            if layer.input is not previous:
                raise StreamPlanError(
                    f"{_describe(layer)} does not take the previous layer's output "
                    "(branches, several inputs or a shared layer)"
                )
            previous = layer.output
        if previous is not model.outputs[0]:
            raise StreamPlanError("the model's output is not its last layer's (a shared layer)")
    except (AttributeError, ValueError) as error:
        if isinstance(error, StreamPlanError):
            raise
        raise StreamPlanError(f"the model is not a chain of layers ({error})") from None
    return layers


def _keras() -> Any:
    import keras

    return keras


def _axis_is_features(axis: Any) -> bool:
    axes = list(axis) if isinstance(axis, list | tuple) else [axis]
    return all(isinstance(a, int) for a in axes) and [a % 3 for a in axes] == [2]


def _per_step_reason(layer: Any) -> str | None:
    """None when `layer` treats each time step alone, else why not."""
    name = type(layer).__name__
    if name not in PER_STEP_LAYERS or type(layer).__module__.split(".")[0] != "keras":
        return f"{_describe(layer)} is not known to treat each time step alone"
    axis = getattr(layer, "axis", -1)
    if name in ("LayerNormalization", "BatchNormalization", "UnitNormalization", "Softmax") and (
        not _axis_is_features(axis)
    ):
        return f"{_describe(layer)} normalizes over axis {axis}, not the features alone"
    return None


def _state_sizes(layer: Any) -> list[int]:
    sizes = getattr(layer.cell, "state_size", None)
    sizes = [sizes] if isinstance(sizes, int) else list(sizes or [])
    if not sizes or not all(isinstance(size, int) and size > 0 for size in sizes):
        raise StreamPlanError(f"{_describe(layer)} has nested or unknown state sizes {sizes}")
    return sizes


def _names(layer: Any, count: int, taken: set[str]) -> list[str]:
    """`state_<layer>_<k>` with the layer name reduced to characters TensorFlow keeps."""
    base = STATE_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", layer.name)
    while any(f"{base}_{k}" in taken for k in range(count)):
        base += "_"
    names = [f"{base}_{k}" for k in range(count)]
    taken.update(names)
    return names


def _plan(model: keras.Model, streaming: bool) -> Plan:
    keras = _keras()
    steps: list[Any] = []
    taken: set[str] = set()
    on_time_axis = True
    for layer in _chain(model):
        if not on_time_axis:
            steps.append(Step(layer, "head"))  # a function of the last output alone
            continue
        if isinstance(layer, keras.layers.RNN):
            if layer.stateful:
                raise StreamPlanError(f"{_describe(layer)} is stateful (states in variables)")
            if streaming and layer.go_backwards:
                raise StreamPlanError(f"{_describe(layer)} runs backwards (needs all of it)")
            if streaming and layer.unroll:
                raise StreamPlanError(f"{_describe(layer)} is unrolled (needs a fixed length)")
            if not streaming and layer.go_backwards and layer.return_sequences:
                raise StreamPlanError(
                    f"{_describe(layer)} returns its outputs backwards (padding comes first)"
                )
            sizes = _state_sizes(layer)
            names = _names(layer, len(sizes), taken) if streaming else []
            steps.append(Step(layer, "recurrent", names, sizes if streaming else []))
            on_time_axis = layer.return_sequences
            continue
        if not streaming and isinstance(layer, keras.layers.Bidirectional):
            if layer.forward_layer.stateful or layer.backward_layer.stateful:
                raise StreamPlanError(f"{_describe(layer)} is stateful (states in variables)")
            steps.append(Step(layer, "recurrent"))
            on_time_axis = layer.return_sequences
            continue
        reason = _per_step_reason(layer)
        if reason is not None:
            if isinstance(layer, keras.layers.Bidirectional):
                reason = f"{_describe(layer)} reads the sequence backwards too (needs all of it)"
            elif "Attention" in type(layer).__name__:
                reason = f"{_describe(layer)} attends over the whole sequence"
            raise StreamPlanError(reason)
        steps.append(Step(layer, "per_step"))
    if not any(step.kind == "recurrent" for step in steps):
        raise StreamPlanError("the model has no recurrent layer")
    return Plan(steps)


def stream_plan(model: keras.Model) -> Plan:
    """The walk of `model` for the `stream` signature.

    Raises:
        StreamPlanError: one line saying why the model cannot stream.
    """
    return _plan(model, streaming=True)


def padded_plan(model: keras.Model) -> Plan:
    """The walk of `model` for the `padded` signature (a mask instead of states).

    Raises:
        StreamPlanError: one line saying why padding cannot be masked in this model.
    """
    return _plan(model, streaming=False)


@contextlib.contextmanager
def _returning(layer: Any, sequences: bool, state: bool) -> Iterator[None]:
    """`layer` returning its sequences and/or states for the duration of one call.

    `RNN.call` reads these attributes when it runs, so the layer's own variables
    serve the new signature (no copy of the weights in the SavedModel).
    """
    saved = layer.return_sequences, layer.return_state
    layer.return_sequences, layer.return_state = sequences, state
    try:
        yield
    finally:
        layer.return_sequences, layer.return_state = saved


def run_plan(
    plan: Plan,
    sequence: tf.Tensor,
    states: dict[str, tf.Tensor] | None = None,
    mask: tf.Tensor | None = None,
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The model's output for `sequence` and the new states (`states` given: `stream`)."""
    tf = import_tensorflow()
    x, new_states = sequence, dict[str, Any]()
    for step in plan.steps:
        layer = step.layer
        if step.kind == "per_step" and type(layer).__name__ == "TimeDistributed":
            x = _time_distributed(layer, x)
            continue
        if step.kind != "recurrent":
            x = layer(x, training=False)
            continue
        if states is None:
            x = layer(x, mask=mask, training=False)
        else:
            initial = [states[name] for name in step.state_names]
            with _returning(layer, layer.return_sequences, True):
                x, *finals = layer(x, initial_state=initial, training=False)
            new_states.update(
                (name, tf.cast(final, tf.float32))
                for name, final in zip(step.state_names, finals, strict=True)
            )
        if not layer.return_sequences:
            mask = None
    return x, new_states


def _time_distributed(layer: Any, x: tf.Tensor) -> tf.Tensor:
    """`TimeDistributed` as one call on all steps side by side: the same per-step
    work, and unlike its loop over a time axis of unknown length, it traces."""
    tf = import_tensorflow()
    shape = tf.shape(x)
    flat = tf.reshape(x, tf.concat([[-1], shape[2:]], 0))
    y = layer.layer(flat, training=False)
    return tf.reshape(y, tf.concat([shape[:2], tf.shape(y)[1:]], 0))


class HeadMath(Protocol):
    """The four operations of `head_outputs`, in one framework's own ops.

    Not `keras.ops`: its TensorFlow `argmax` adds bitwise ops (to order -0.0 before
    0.0) that LiteRT has no builtins for.
    """

    def float32(self, x: Any) -> Any: ...
    def softmax(self, x: Any) -> Any: ...
    def argmax(self, x: Any) -> Any: ...  # int64, over the last axis
    def squeeze_last(self, x: Any) -> Any: ...


class TensorFlowMath:
    """`HeadMath` in TensorFlow's ops (LiteRT builtins and tf2onnx lower each)."""

    def __init__(self) -> None:
        self.tf = import_tensorflow()

    def float32(self, x: Any) -> Any:
        return self.tf.cast(x, self.tf.float32)

    def softmax(self, x: Any) -> Any:
        return self.tf.nn.softmax(x, axis=-1)

    def argmax(self, x: Any) -> Any:
        return self.tf.argmax(x, axis=-1, output_type=self.tf.int64)

    def squeeze_last(self, x: Any) -> Any:
        return self.tf.squeeze(x, -1)


def head_outputs(
    outputs: tf.Tensor, head: str, valid: tf.Tensor | None = None, math: HeadMath | None = None
) -> dict[str, tf.Tensor]:
    """The signature's named outputs of the model's raw `outputs` for `head`.

    `valid`: `(batch, T)` booleans of a per-step head's real steps; the others
    answer logits and probabilities 0 and class id -1 (padding is no prediction;
    TensorFlow only). `math`: the framework's ops (default `TensorFlowMath`).
    """
    math = TensorFlowMath() if math is None else math
    kind = HEADS[head]
    outputs = math.float32(outputs)
    if kind.regression:
        return {"value": math.squeeze_last(outputs) if outputs.shape[-1] == 1 else outputs}
    probabilities = math.softmax(outputs)
    ids = math.argmax(outputs)
    if valid is not None and kind.per_step:
        tf = import_tensorflow()
        outputs = tf.where(valid[..., None], outputs, 0.0)
        probabilities = tf.where(valid[..., None], probabilities, 0.0)
        ids = tf.where(valid, ids, tf.constant(-1, tf.int64))
    name = "class_ids" if kind.per_step else "class_id"
    return {"probabilities": probabilities, name: ids, "logits": outputs}


def stream_endpoint(plan: Plan, head: str, features: int) -> tuple[Callable, list]:
    """`(fn, input_signature)` of the `stream` signature.

    Inputs: `sequence` `(batch, t, m)` for any t >= 1 and one `(batch, units)`
    input per state (zeros start a sequence). Outputs: the head's outputs after
    the chunk (per-step heads: one per step of the chunk) and the new states,
    named as the inputs, to be sent with the next chunk.
    """
    tf = import_tensorflow()
    names = list(plan.states)
    spec = [tf.TensorSpec([None, None, features], tf.float32, name="sequence")]
    spec += [tf.TensorSpec([None, size], tf.float32, name=n) for n, size in plan.states.items()]

    def stream(sequence, *states):
        outputs, new_states = run_plan(plan, sequence, dict(zip(names, states, strict=True)))
        return {**head_outputs(outputs, head), **new_states}

    return stream, spec


def padded_endpoint(
    plan: Plan, head: str, steps: int | None, features: int
) -> tuple[Callable, list]:
    """`(fn, input_signature)` of the `padded` signature.

    Inputs: `sequence` `(batch, T, m)` padded at the end with anything, and
    `length` `(batch,)` int32, each example's real number of steps (1..T).
    Each example's outputs equal its prediction on its first `length` steps.
    """
    if HEADS[head].per_step and plan.steps[-1].kind == "head":
        raise StreamPlanError("its per-step outputs are not aligned with the input's steps")
    tf = import_tensorflow()
    spec = [
        tf.TensorSpec([None, steps, features], tf.float32, name=SEQUENCE_INPUT),
        tf.TensorSpec([None], tf.int32, name=LENGTH_INPUT),
    ]

    def padded(sequence, length):
        total = tf.shape(sequence)[1]
        checks = [
            tf.debugging.assert_greater_equal(
                length, 1, message="Input 'length' must be at least 1"
            ),
            tf.debugging.assert_less_equal(
                length, total, message="Input 'length' must be at most the sequence's steps"
            ),
        ]
        with tf.control_dependencies(checks):
            valid = tf.sequence_mask(length, total)
        # Zeroed padding: NaN or huge values there cannot reach a valid step.
        sequence = tf.where(valid[..., None], sequence, 0.0)
        outputs, _ = run_plan(plan, sequence, mask=valid)
        return head_outputs(outputs, head, valid if HEADS[head].per_step else None)

    return padded, spec
