"""A model as one time step, for runtimes without Keras' recurrent loop: LiteRT and ONNX.

Keras runs a recurrent layer with a loop that collects every step's output in
a `TensorList` (TensorFlow) or a Python list (PyTorch). Neither lowers to
LiteRT's builtin ops or to a dynamic-length ONNX graph. This module turns a
model that can stream (`serving.exports.signatures.stream_plan`) into a `StepProgram`:

* `step(x_t, states)`: one time step through every layer on the time axis:
  each recurrent layer's *cell* on that step (the cell's own `call`, so the
  arithmetic is the layer's) and the per-step layers between them;
* `finish(y)`: the layers after the time axis is gone (the head), on the
  output of the last step, or on every step's output for a per-step head.

The runtimes' exporters put `step` inside their own loop (`tf.while_loop`,
which becomes LiteRT's `WHILE` and ONNX's `Loop`; or an ONNX `Loop` around a
traced step) and call `finish` after it, with `sequence()` around the
loop so that each cell's constants are formed once. `FrozenWeights` binds every
weight to a constant while the graph is traced, so the written graph holds
the weights as constants: no variables, which LiteRT's `WHILE` bodies cannot
read. Everything here is `keras.ops`, so the same step traces on TensorFlow
and on PyTorch.

Only the exports import this module; it imports Keras when called.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from serving.exports.signatures import Plan, Step, StreamPlanError, stream_plan

if TYPE_CHECKING:
    import keras


class PortableExportError(ValueError):
    """A model, layer or dtype a LiteRT or ONNX export cannot take (one line)."""


@dataclass
class StepProgram:
    """`plan`'s layers as a per-step function (`looped`) and a head after the loop."""

    plan: Plan
    looped: list[Step]
    head: list[Step]
    per_step: bool
    output_size: int

    @property
    def states(self) -> dict[str, int]:
        """`{state input name: units}` in layer order (as the `stream` signature's)."""
        return self.plan.states

    def step(self, x: Any, states: Sequence[Any]) -> tuple[Any, list[Any]]:
        """One time step: `x` `(batch, 1, m)`, `states` in `states` order.

        Returns:
            `(y, new_states)`: `y` `(batch, output_size)`, the last looped
            layer's output for this step.
        """
        ops = _keras().ops
        states = list(states)
        new_states: list[Any] = []
        for item in self.looped:
            layer = item.layer
            if item.kind == "per_step":
                if type(layer).__name__ == "TimeDistributed":
                    x = ops.expand_dims(layer.layer(x[:, 0], training=False), 1)
                else:
                    x = layer(x, training=False)
                continue
            count = len(item.state_names)
            mine, states = states[:count], states[count:]
            output, finals = layer.cell(x[:, 0], mine, training=False)
            finals = list(finals) if isinstance(finals, list | tuple) else [finals]
            new_states.extend(ops.cast(final, "float32") for final in finals)
            x = ops.expand_dims(output, 1)
        return ops.cast(x[:, 0], "float32"), new_states

    @contextlib.contextmanager
    def sequence(self) -> Iterator[None]:
        """The cells' per-sequence constants formed once, for every `step` in the block.

        Entered outside the loop, a cell's transition matrix (`W − Wᵀ − γI`, a
        scatter and a transpose) is formed once, as `keras.layers.RNN` does
        before its loop, not inside every iteration of the exported loop.
        Cells without per-sequence constants (Keras' own) are unaffected.
        """
        with contextlib.ExitStack() as stack:
            for item in self.looped:
                scope = getattr(getattr(item.layer, "cell", None), "sequence_scope", None)
                if item.kind == "recurrent" and scope is not None:
                    stack.enter_context(scope())
            yield

    def finish(self, outputs: Any) -> Any:
        """The head's layers on the loop's output (`(batch, k)`, or `(batch, T, k)` per step)."""
        for item in self.head:
            outputs = item.layer(outputs, training=False)
        return outputs


def _keras() -> Any:
    import keras

    return keras


def step_program(model: keras.Model) -> StepProgram:
    """The `StepProgram` of `model`.

    Raises:
        serving.exports.signatures.StreamPlanError: one line saying why `model` cannot stream.
    """
    plan = stream_plan(model)
    recurrent = [i for i, item in enumerate(plan.steps) if item.kind == "recurrent"]
    last = recurrent[-1]
    per_step = plan.steps[last].layer.return_sequences
    # A per-step head keeps the trailing per-step layers in the loop; otherwise
    # they follow the last recurrent layer's final output, once.
    cut = len(plan.steps) if per_step else last + 1
    looped, head = plan.steps[:cut], plan.steps[cut:]
    size = _output_size(looped)
    return StepProgram(plan, looped, head, per_step, size)


def _output_size(looped: list[Step]) -> int:
    shape = getattr(looped[-1].layer, "output", None)
    shape = tuple(getattr(shape, "shape", ()) or ())
    if not shape or not isinstance(shape[-1], int):
        raise StreamPlanError(
            f"layer {looped[-1].layer.name!r} has no known output size (build the model first)"
        )
    return int(shape[-1])


def check_float32(model: keras.Model, runtime: str) -> None:
    """Raises `PortableExportError` naming the first layer that does not compute in float32.

    LiteRT's and ONNX Runtime's CPU kernels for these graphs are float32;
    `--quantize float16` is the way to half-size weights.
    """
    for layer in _all_layers(model):
        # Keras' policies keep variables at least as wide as the computation (mixed ones:
        # float32 variables), so the compute dtype alone tells a float32 layer.
        policy = layer.dtype_policy
        if policy.compute_dtype != "float32":
            raise PortableExportError(
                f"layer {layer.name!r} ({type(layer).__name__}) uses dtype policy "
                f"{policy.name!r}: "
                f"the {runtime} export takes float32 layers; save a float32 copy of the "
                "model (its weights with a float32 policy) and export that, with "
                "`--quantize float16` for half-size weights"
            )


def _all_layers(model: Any) -> Iterator[Any]:
    for layer in getattr(model, "layers", []):
        yield layer
        cell = getattr(layer, "cell", None)
        if cell is not None:
            yield cell
        yield from _all_layers(layer)


class FrozenWeights:
    """`model`'s weights as NumPy values, read once, outside any trace."""

    def __init__(self, model: keras.Model):
        keras = _keras()
        self.weights = list(model.weights)
        self.values = [keras.ops.convert_to_numpy(weight.value) for weight in self.weights]

    @contextlib.contextmanager
    def constants(self, constant: Callable[[Any], Any]) -> Iterator[None]:
        """Every weight read as `constant(its value)` inside the block.

        Entered while a graph is traced, it puts the weights in the graph as
        constants: LiteRT's `WHILE` bodies and a traced ONNX step cannot read
        variables.
        """
        keras = _keras()
        pairs = zip(self.weights, self.values, strict=True)
        mapping = [(weight, constant(value)) for weight, value in pairs]
        with keras.StatelessScope(state_mapping=mapping):
            yield
