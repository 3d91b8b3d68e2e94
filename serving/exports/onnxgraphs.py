"""ONNX exports: `serving_default.onnx` and `stream.onnx`, from TensorFlow or from PyTorch.

Each signature is its own ONNX model (an ONNX graph has one set of inputs),
with the SavedModel's input names and outputs; the new states of `stream`
are named `next_<state>` (`serving.exports.runtimes.next_name`), as an ONNX graph
cannot give an input's name to an output. Time and batch are dynamic axes.

* TensorFlow backend: the graphs of `serving.exports.tfloop` (one `tf.while_loop`
  over the model's step) converted by tf2onnx; the loop becomes `Loop`.
* PyTorch backend: tracing would unroll Keras' Python loop to one length,
  so one time step of the model (`serving.exports.steploop.StepProgram.step`) and its
  head are traced with `torch.onnx.export`, and `loop_model` puts the step in
  an ONNX `Loop` over the chunk's steps. The TorchScript exporter is used: it
  ships with PyTorch (the newer one needs `onnxscript`).

Only the export imports this module; the frameworks and `onnx` are imported
when called. TensorFlow and PyTorch are never imported together: a process
exports from the backend its Keras runs on.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import TYPE_CHECKING, Any

from serving.exports.runtimes import next_name
from serving.exports.signatures import StreamPlanError
from serving.exports.steploop import FrozenWeights, StepProgram, check_float32, step_program
from serving.names import DEFAULT_SIGNATURE, SEQUENCE_INPUT, STREAM_SIGNATURE

if TYPE_CHECKING:
    import keras
    import onnx

OPSET = 17
# Keras layers whose PyTorch ops the TorchScript exporter cannot trace with a dynamic batch.
TORCH_UNTRACEABLE = frozenset({"LayerNormalization"})


def convert(
    model: keras.Model, head: str, stream: bool = True, notes: list[str] | None = None
) -> dict[str, bytes]:
    """`{signature: ONNX model bytes}` of `model`, from the backend Keras runs on.

    Raises:
        serving.exports.steploop.PortableExportError: a float16/bfloat16 layer, or (PyTorch)
            a model that cannot stream.
    """
    import keras

    check_float32(model, "ONNX")
    backend = keras.backend.backend()
    exporters = {"tensorflow": _from_tensorflow, "torch": _from_torch}
    if backend not in exporters:
        from apputil.errors import Literal, invalid

        raise invalid(
            "model",
            "a model on the TensorFlow or PyTorch backend (KERAS_BACKEND)",
            Literal(f"backend {backend!r}"),
        )
    models, missing = exporters[backend](model, head, stream)
    if notes is not None and stream and missing:
        notes.append(f"no `{STREAM_SIGNATURE}` signature: {missing}")
    return models


def _from_tensorflow(
    model: keras.Model, head: str, stream: bool
) -> tuple[dict[str, bytes], str | None]:
    from apputil.quiet import native_stderr_silenced
    from serving.exports.tfloop import TensorArrays, graphs

    built = graphs(model, head, TensorArrays(), stream, state_output=next_name)
    with native_stderr_silenced(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import tf2onnx

        models = {}
        for name, function in built.functions.items():
            proto, _ = tf2onnx.convert.from_function(
                function, input_signature=function.input_signature, opset=OPSET
            )
            proto.graph.name = name  # as the PyTorch path names them: the signature
            models[name] = proto.SerializeToString()
    return models, built.stream_missing


def _from_torch(model: keras.Model, head: str, stream: bool) -> tuple[dict[str, bytes], str | None]:
    from serving.exports.steploop import PortableExportError

    try:
        program = step_program(model)
    except StreamPlanError as error:
        raise PortableExportError(
            f"the PyTorch ONNX export runs the model one step at a time, and {error}: "
            "export it from the TensorFlow backend (--backend tensorflow)"
        ) from None
    for item in program.plan.steps:
        if type(item.layer).__name__ in TORCH_UNTRACEABLE:
            raise PortableExportError(
                f"layer {item.layer.name!r} ({type(item.layer).__name__}) cannot be traced by "
                "PyTorch's ONNX exporter (its shape is read at run time): export it from the "
                "TensorFlow backend (--backend tensorflow)"
            )
    features = int(model.inputs[0].shape[2])
    steps = model.inputs[0].shape[1]
    step, head_graph, outputs = _traced(model, program, head, features)
    models = {
        DEFAULT_SIGNATURE: loop_model(step, head_graph, program, features, steps, outputs, False)
    }
    if stream:
        models[STREAM_SIGNATURE] = loop_model(
            step, head_graph, program, features, None, outputs, True
        )
    return {name: proto.SerializeToString() for name, proto in models.items()}, None


def _traced(
    model: keras.Model, program: StepProgram, head: str, features: int
) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """The step `(x (batch, 1, m), *states) -> (y, *new_states)` and the head
    `y -> outputs`, each traced by `torch.onnx.export`; and the head's output names."""
    import onnx
    import torch

    from serving.exports.signatures import head_outputs

    frozen = FrozenWeights(model)
    names = list(program.states)
    sizes = list(program.states.values())

    class Step(torch.nn.Module):
        def forward(self, x: Any, *states: Any) -> Any:
            with frozen.constants(torch.from_numpy):
                y, finals = program.step(x, states)
            return (y, *finals)

    probe = head_outputs(torch.zeros(1, program.output_size), head, math=TorchMath())
    output_names = list(probe)

    class Head(torch.nn.Module):
        def forward(self, y: Any) -> Any:
            with frozen.constants(torch.from_numpy):
                outputs = head_outputs(program.finish(y), head, math=TorchMath())
            return tuple(outputs[name] for name in output_names)

    batch = {0: "batch"}
    step_inputs = (torch.zeros(2, 1, features), *[torch.zeros(2, size) for size in sizes])
    step_axes = {name: batch for name in ["x", *names, "y", *[f"new_{n}" for n in names]]}
    head_input = (
        torch.zeros(2, 3, program.output_size)
        if program.per_step
        else torch.zeros(2, program.output_size)
    )
    head_axes = {"y": {0: "batch", 1: "time"} if program.per_step else batch}
    head_axes.update({name: {0: "batch", 1: "time"} for name in output_names})
    traced = []
    with contextlib.ExitStack() as sequence:
        # The cells' constants formed here, before the trace, enter the traced step as
        # constants: the `Loop` body then holds no scatter forming `W − Wᵀ − γI`.
        with frozen.constants(torch.from_numpy), torch.no_grad():
            sequence.enter_context(program.sequence())
        for module, inputs, input_names, out_names, axes in (
            (Step(), step_inputs, ["x", *names], ["y", *[f"new_{n}" for n in names]], step_axes),
            (Head(), (head_input,), ["y"], output_names, head_axes),
        ):
            buffer = io.BytesIO()
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    module, inputs, buffer, dynamo=False, opset_version=OPSET,
                    input_names=input_names, output_names=out_names,
                    dynamic_axes={k: v for k, v in axes.items() if k in input_names + out_names},
                )  # fmt: skip
            traced.append(onnx.load_from_string(buffer.getvalue()))
    return traced[0], traced[1], output_names


class TorchMath:
    """`serving.exports.signatures.HeadMath` in PyTorch's ops."""

    def float32(self, x: Any) -> Any:
        return x.float()

    def softmax(self, x: Any) -> Any:
        import torch

        return torch.softmax(x, dim=-1)

    def argmax(self, x: Any) -> Any:
        import torch

        return torch.argmax(x, dim=-1)

    def squeeze_last(self, x: Any) -> Any:
        return x.squeeze(-1)


def loop_model(
    step: onnx.ModelProto,
    head: onnx.ModelProto,
    program: StepProgram,
    features: int,
    steps: int | None,
    outputs: list[str],
    streaming: bool,
) -> onnx.ModelProto:
    """An ONNX model running `step` in a `Loop` over the steps of `sequence`, then `head`.

    `streaming`: the states are inputs and the new states outputs
    (`next_<state>`); else the loop starts from zeros (`serving_default`).
    """
    import onnx
    from onnx import TensorProto, helper

    step_graph = onnx.compose.add_prefix(step, "step/").graph
    head_graph = onnx.compose.add_prefix(head, "head/").graph
    names = list(program.states)
    pairs = list(program.states.items())
    float_info = helper.make_tensor_value_info

    # The loop body: (iteration, condition, *states) -> (condition, *new states, y).
    body_inputs = [
        float_info("iteration", TensorProto.INT64, []),
        float_info("condition", TensorProto.BOOL, []),
        *[float_info(f"carried/{n}", TensorProto.FLOAT, ["batch", s]) for n, s in pairs],
    ]
    body_nodes = [
        helper.make_node("Gather", [SEQUENCE_INPUT, "iteration"], ["x_t"], axis=1),
        helper.make_node("Unsqueeze", ["x_t", "axis_1"], ["step/x"]),
        *[helper.make_node("Identity", [f"carried/{n}"], [f"step/{n}"]) for n in names],
        *step_graph.node,
        helper.make_node("Identity", ["condition"], ["condition_out"]),
        *[helper.make_node("Identity", [f"step/new_{n}"], [f"out/{n}"]) for n in names],
        helper.make_node("Identity", ["step/y"], ["out/y"]),
    ]
    body_outputs = [
        float_info("condition_out", TensorProto.BOOL, []),
        *[float_info(f"out/{n}", TensorProto.FLOAT, ["batch", s]) for n, s in pairs],
        float_info("out/y", TensorProto.FLOAT, ["batch", program.output_size]),
    ]
    axis_1 = helper.make_tensor("axis_1", TensorProto.INT64, [1], [1])
    body = helper.make_graph(
        body_nodes, "step", body_inputs, body_outputs,
        initializer=[axis_1, *step_graph.initializer],
    )  # fmt: skip

    nodes = [
        helper.make_node("Shape", [SEQUENCE_INPUT], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["steps"], axis=0),
        helper.make_node("Gather", ["shape", "zero_vector"], ["batch_vector"], axis=0),
    ]
    initial = []
    for name in names:
        if streaming:
            initial.append(name)
            continue
        nodes += [
            helper.make_node("Concat", ["batch_vector", f"size/{name}"], [f"shape/{name}"], axis=0),
            helper.make_node(
                "ConstantOfShape", [f"shape/{name}"], [f"zeros/{name}"],
                value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]),
            ),
        ]  # fmt: skip
        initial.append(f"zeros/{name}")
    finals = [next_name(n) if streaming else f"final/{n}" for n in names]
    nodes.append(
        helper.make_node("Loop", ["steps", "true", *initial], [*finals, "scan"], body=body)
    )
    constants = [
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("zero_vector", TensorProto.INT64, [1], [0]),
        helper.make_tensor("true", TensorProto.BOOL, [], [True]),
    ]
    if not streaming:
        constants += [
            helper.make_tensor(f"size/{n}", TensorProto.INT64, [1], [s]) for n, s in pairs
        ]
    if program.per_step:
        nodes.append(helper.make_node("Transpose", ["scan"], ["head/y"], perm=[1, 0, 2]))
    else:  # the last step's output
        constants.append(helper.make_tensor("last", TensorProto.INT64, [], [-1]))
        nodes.append(helper.make_node("Gather", ["scan", "last"], ["head/y"], axis=0))
    nodes += list(head_graph.node)
    nodes += [helper.make_node("Identity", [f"head/{o}"], [o]) for o in outputs]

    inputs = [float_info(SEQUENCE_INPUT, TensorProto.FLOAT, ["batch", steps or "time", features])]
    if streaming:
        inputs += [float_info(n, TensorProto.FLOAT, ["batch", s]) for n, s in pairs]
    head_outputs = {value.name: value for value in head_graph.output}
    graph_outputs = []
    for name in outputs:
        value = onnx.ValueInfoProto()
        value.CopyFrom(head_outputs[f"head/{name}"])
        value.name = name
        graph_outputs.append(value)
    if streaming:
        graph_outputs += [
            float_info(next_name(n), TensorProto.FLOAT, ["batch", s]) for n, s in pairs
        ]
    graph = helper.make_graph(
        nodes, STREAM_SIGNATURE if streaming else DEFAULT_SIGNATURE, inputs, graph_outputs,
        initializer=[*constants, *head_graph.initializer],
    )  # fmt: skip
    merged = helper.make_model(graph, opset_imports=list(step.opset_import))
    merged.ir_version = step.ir_version
    onnx.checker.check_model(merged)
    return merged
