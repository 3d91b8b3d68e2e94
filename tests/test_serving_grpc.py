"""TensorFlow Serving's gRPC API in the local server: Predict (every signature),
GetModelMetadata and GetModelStatus with TensorFlow Serving's own protos and stubs, its
status codes, the limits, the drain, the metrics, and the client's `--grpc`."""

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import grpc
import keras
import numpy as np
import pytest
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from apputil.errors import UsageError
from keras_antisym import AntisymmetricRNN, GatedAntisymmetricRNN
from serving.client import GrpcClient, ServingClient, ServingError
from serving.client import main as client_main
from serving.exports.export import export_model
from serving.local import tensors
from serving.local.grpcd import GrpcApp, GrpcServer
from serving.local.metrics import ServingMetrics
from serving.local.payload import RequestError
from serving.local.plane import DataPlane
from tests.limits import limit
from tests.serving_helpers import REPO_ROOT, ServerProcess, ThreadServer, http_call

pytestmark = pytest.mark.timeout(300)

T, M, UNITS = 12, 3, 4


def _model():
    """A seeded stack with three states (two cells and an LSTM's two) and a 3-class head."""
    keras.utils.set_random_seed(11)
    model = keras.Sequential(
        [
            keras.Input((T, M)),
            AntisymmetricRNN(UNITS, epsilon=0.3, gamma=0.01, return_sequences=True),
            keras.layers.LSTM(UNITS, return_sequences=True, name="lstm"),
            GatedAntisymmetricRNN(UNITS, epsilon=0.3),
            keras.layers.Dense(3, name="classification_head"),
        ],
        name="stacked",
    )
    for weight in model.weights:  # away from zero biases: a wrong state would show
        weight.assign(weight + np.random.default_rng(1).normal(0, 0.2, weight.shape))
    return model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`(model, ThreadServer)`: the stack exported as version 3, served over REST and gRPC
    (a folder of its own each time: a run that orders tests by duration sets it up again)."""
    model = _model()
    base = str(tmp_path_factory.mktemp("grpc") / "stacked")
    export_model(model, base, 3)
    server = ThreadServer(base, "stacked", grpc_port=0)
    try:
        yield model, server
    finally:
        server.stop()


def _target(server):
    host, port = server.server.grpc_address
    return f"{host}:{port}"


@pytest.fixture(scope="module")
def stubs(served):
    _, server = served
    channel = grpc.insecure_channel(_target(server))
    try:
        yield (
            prediction_service_pb2_grpc.PredictionServiceStub(channel),
            model_service_pb2_grpc.ModelServiceStub(channel),
        )
    finally:
        channel.close()


def _request(inputs, name="stacked", signature=None, version=None):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if signature is not None:
        request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tensors.to_tensor_proto(value))
    return request


def _outputs(response):
    return {name: tensors.to_array(value) for name, value in response.outputs.items()}


def _x(batch=2, steps=T, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, steps, M)).astype("float32")


def _state_names(served_server):
    metadata = ServingClient(served_server.url, "stacked").metadata()
    inputs = metadata["metadata"]["signature_def"]["signature_def"]["stream"]["inputs"]
    return {name: int(info["tensor_shape"]["dim"][-1]["size"])
            for name, info in inputs.items() if name != "sequence"}  # fmt: skip


def test_predict_answers_every_signature_exactly_as_the_rest_api(served, stubs):
    """The same float32 numbers as REST's JSON (bit for bit), and Keras' within 1e-5."""
    model, server = served
    predict, _ = stubs
    x = _x()
    states = {name: np.random.default_rng(len(name)).normal(size=(2, size)).astype("float32")
              for name, size in _state_names(server).items()}  # fmt: skip
    assert len(states) == 4  # the two cells' and the LSTM's h and c
    cases = {
        "serving_default": {"sequence": x},
        "stream": {"sequence": x[:, :5], **states},
        "padded": {"sequence": x, "length": np.array([T, 7], "int32")},
    }
    url = f"{server.url}/v1/models/stacked:predict"
    for signature, inputs in cases.items():
        response = predict.Predict(_request(inputs, signature=signature), timeout=limit(60))
        assert (response.model_spec.name, response.model_spec.version.value,
                response.model_spec.signature_name) == ("stacked", 3, signature)  # fmt: skip
        got = _outputs(response)
        body = {"signature_name": signature, "inputs": {k: v.tolist() for k, v in inputs.items()}}
        status, rest = http_call(url, "POST", body)
        assert status == 200, rest
        assert sorted(got) == sorted(rest["outputs"]), signature
        for name, value in got.items():
            expected = np.asarray(rest["outputs"][name]).astype(value.dtype)
            np.testing.assert_array_equal(value, expected, err_msg=f"{signature} {name}")
    whole = _outputs(predict.Predict(_request({"sequence": x}), timeout=limit(60)))
    np.testing.assert_allclose(whole["logits"], model.predict(x, verbose=0), atol=1e-5, rtol=0)
    assert whole["class_id"].tolist() == np.argmax(whole["logits"], axis=-1).tolist()


def test_both_transports_answer_from_one_data_plane(served):
    """The same request over REST and gRPC meets the same limit, in the same words, and both
    are counted on the one metrics page, each under its entrypoint."""
    from prometheus_client.parser import text_string_to_metric_families

    _, server = served
    local = server.server
    assert local.app.plane is local.plane is local.grpc.app.plane
    assert local.transports == [local.rest, local.grpc]
    before = local.plane.max_input_elements
    local.plane.max_input_elements = 8  # fewer numbers than one sequence holds
    try:
        inputs = {"sequence": _x()[:1]}
        with grpc.insecure_channel(_target(server)) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Predict(_request(inputs), timeout=limit(60))
        body = {"inputs": {k: v.tolist() for k, v in inputs.items()}}
        status, rest = http_call(f"{server.url}/v1/models/stacked:predict", "POST", body)
    finally:
        local.plane.max_input_elements = before
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and status == 400
    assert refused.value.details() == rest["error"] and "8" in rest["error"]
    page = http_call(f"{server.url}/monitoring/prometheus/metrics")[1]
    families = {f.name: f for f in text_string_to_metric_families(page)}
    entrypoints = {s.labels["entrypoint"] for s in families[":tensorflow:serving:request_latency"]
                   .samples if s.labels.get("model_name") == "stacked"}  # fmt: skip
    assert entrypoints == {"REST", "GRPC"}


@pytest.mark.parametrize("chunk", [1, 7, T])
def test_a_grpc_stream_chunk_by_chunk_equals_keras_on_the_whole_sequence(served, chunk):
    model, server = served
    x = _x(seed=chunk)
    with GrpcClient(_target(server), "stacked", timeout=limit(60)) as client:
        answers = list(client.stream(x[:, start : start + chunk] for start in range(0, T, chunk)))
        single = list(client.stream([x[1]]))  # one sequence, no batch axis
    assert len(answers) == -(-T // chunk)
    expected = model.predict(x, verbose=0)
    np.testing.assert_allclose(answers[-1]["logits"], expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(single[0]["logits"], expected[1], atol=1e-5, rtol=0)
    assert sorted(answers[-1]) == ["class_id", "logits", "probabilities"]  # no states


def test_metadata_and_status_are_the_rest_bodies(served):
    _, server = served
    rest = ServingClient(server.url, "stacked")
    with GrpcClient(_target(server), "stacked") as client:
        assert client.metadata() == rest.metadata()
        assert client.metadata(version=3) == rest.metadata(version=3)
        assert client.status() == rest.status()
        assert client.status() == {"model_version_status": [
            {"version": "3", "state": "AVAILABLE",
             "status": {"error_code": "OK", "error_message": ""}}]}  # fmt: skip


def test_lists_take_the_signature_s_dtypes_and_arrays_their_own(served):
    _, server = served
    x = _x(batch=1)
    with GrpcClient(_target(server), "stacked") as client:
        from_lists = client.predict(
            {"sequence": x.tolist(), "length": [5]}, signature_name="padded"
        )
        bare = client.predict(x.tolist())  # one input: sent under its name
        with pytest.raises(ServingError) as refused:
            client.predict({"sequence": x.astype("float64")})
    with GrpcClient(_target(server), "stacked") as client:
        arrays = client.predict(
            {"sequence": x, "length": np.array([5], "int32")}, signature_name="padded"
        )
    for name, value in arrays["outputs"].items():
        np.testing.assert_array_equal(from_lists["outputs"][name], value)
    assert bare["model_spec"] == {"name": "stacked", "version": "3",
                                  "signature_name": "serving_default"}  # fmt: skip
    assert arrays["outputs"]["logits"].dtype == np.float32
    assert refused.value.code == "INVALID_ARGUMENT" and refused.value.status is None
    assert refused.value.message == "Input 'sequence' expects dtype DT_FLOAT, got DT_DOUBLE"


def _proto(dtype=1, shape=(1, T, M), content=None, **fields):
    """A hand-made TensorProto: what a client other than ours may send."""
    from tensorflow.core.framework import tensor_pb2

    proto = tensor_pb2.TensorProto(dtype=dtype, **fields)
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    if content is not None:
        proto.tensor_content = content
    return proto


def _bad_calls():
    """`(name, make the request, code, message)` of calls refused with a status."""
    good = _x(batch=1)

    def predict(inputs=None, **spec):
        return "Predict", _request({"sequence": good} if inputs is None else inputs, **spec)

    def raw(proto, signature=None):
        request = _request({}, signature=signature)
        request.inputs["sequence"].CopyFrom(proto)
        return "Predict", request

    metadata = get_model_metadata_pb2.GetModelMetadataRequest
    return [
        ("unknown model", predict(name="other"), "NOT_FOUND",
         "Servable not found for request: Latest(other)"),
        ("no model name", predict(name=""), "INVALID_ARGUMENT", "Missing ModelSpec"),
        ("version not served", predict(version=2), "NOT_FOUND",
         "Servable not found for request: Specific(stacked, 2): no version folder 2 under the "
         "model's base path"),
        ("version label", ("Predict", _label_request()), "INVALID_ARGUMENT",
         "Unrecognized servable version label: canary"),
        ("unknown signature", predict(signature="nope"), "FAILED_PRECONDITION",
         'Serving signature name: "nope" not found in signature def (signatures: padded, '
         'serving_default, stream)'),
        ("missing input", predict({"seq": good}), "INVALID_ARGUMENT",
         "input size does not match signature: 1!=1 len({seq}) != len({sequence}). Sent extra: "
         "{seq}. Missing but required: {sequence}."),
        ("wrong dtype", predict({"sequence": good.astype("float64")}), "INVALID_ARGUMENT",
         "Input 'sequence' expects dtype DT_FLOAT, got DT_DOUBLE"),
        ("wrong shape", predict({"sequence": good[:, :, :2]}), "INVALID_ARGUMENT",
         f"Input 'sequence' expects shape [-1, {T}, {M}], got [1, {T}, 2]"),
        ("wrong rank", predict({"sequence": good[0]}), "INVALID_ARGUMENT",
         f"Input 'sequence' expects shape [-1, {T}, {M}], got [{T}, {M}]"),
        ("empty batch", predict({"sequence": good[:0]}), "INVALID_ARGUMENT",
         "Input 'sequence' has an empty dimension (empty batch or sequence)"),
        ("NaN", predict({"sequence": np.full((1, T, M), np.nan, "float32")}), "INVALID_ARGUMENT",
         "Input 'sequence' contains NaN or Infinity"),
        ("short content", raw(_proto(content=b"\0" * 8)), "INVALID_ARGUMENT",
         f"Input 'sequence' has 8 bytes of tensor_content; shape [1, {T}, {M}] of float32 "
         f"takes {4 * T * M}"),
        ("few values", raw(_proto(float_val=[1.0, 2.0])), "INVALID_ARGUMENT",
         f"Input 'sequence' has 2 values in float_val; shape [1, {T}, {M}] takes {T * M}"),
        ("unknown rank", raw(_proto(shape=(), tensor_shape={"unknown_rank": True})),
         "INVALID_ARGUMENT", "Input 'sequence' has an unknown rank"),
        ("length out of range",
         predict({"sequence": good, "length": np.array([T + 1], "int32")}, signature="padded"),
         "INVALID_ARGUMENT",
         f"Input 'length' of row 0 is {T + 1}; each row's length must be in 1..{T} (the steps "
         "of input 'sequence')"),
        ("batches differ",
         predict({"sequence": _x(batch=2), "length": np.array([3], "int32")}, signature="padded"),
         "INVALID_ARGUMENT", "Inputs have different batch sizes"),
        ("unknown output", ("Predict", _filtered(["logits", "value"])), "INVALID_ARGUMENT",
         "output tensor alias not found in signature: value Outputs expected to be in the set "
         "{class_id,logits,probabilities}."),
        ("metadata without field", ("GetModelMetadata", metadata(model_spec={"name": "stacked"})),
         "INVALID_ARGUMENT", "GetModelMetadataRequest must specify at least one metadata_field"),
        ("metadata of another field",
         ("GetModelMetadata", metadata(model_spec={"name": "stacked"}, metadata_field=["x"])),
         "INVALID_ARGUMENT", "Metadata field x is not supported"),
        ("status of a missing version",
         ("GetModelStatus", get_model_status_pb2.GetModelStatusRequest(
             model_spec={"name": "stacked", "version": {"value": 9}})),
         "NOT_FOUND", "Could not find version 9 of model stacked"),
    ]  # fmt: skip


def _label_request():
    request = _request({"sequence": _x(batch=1)})
    request.model_spec.version_label = "canary"
    return request


def _filtered(names):
    request = _request({"sequence": _x(batch=1)})
    request.output_filter.extend(names)
    return request


@pytest.mark.parametrize(
    ("method", "request_", "code", "message"),
    [(*call, code, message) for _, call, code, message in _bad_calls()],
    ids=[case[0] for case in _bad_calls()],
)
def test_bad_calls_get_tensorflow_serving_s_codes_and_the_server_keeps_serving(
    served, stubs, method, request_, code, message
):
    predict, models = stubs
    stub = models if method == "GetModelStatus" else predict
    with pytest.raises(grpc.RpcError) as refused:
        getattr(stub, method)(request_, timeout=limit(60))
    assert (refused.value.code().name, refused.value.details()) == (code, message)
    assert predict.Predict(_request({"sequence": _x(batch=1)}), timeout=limit(60)).outputs


def test_an_output_filter_answers_only_the_outputs_named(stubs):
    predict, _ = stubs
    response = predict.Predict(_filtered(["probabilities"]), timeout=limit(60))
    assert list(response.outputs) == ["probabilities"]
    np.testing.assert_allclose(tensors.to_array(response.outputs["probabilities"]).sum(-1), 1,
                               rtol=1e-5)  # fmt: skip


def test_the_other_apis_of_the_services_are_unimplemented(stubs):
    predict, _ = stubs
    with pytest.raises(grpc.RpcError) as refused:
        predict.Classify(classification_pb2.ClassificationRequest(), timeout=limit(60))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_grpc_calls_are_counted_under_the_grpc_entrypoint(stubs):
    from prometheus_client.parser import text_string_to_metric_families

    predict, models = stubs
    metrics = ServingMetrics()
    app = GrpcApp(DataPlane(_Repository(), metrics=metrics))
    server = GrpcServer(app, "127.0.0.1", 0, threads=2, max_queued_requests=2,
                        max_message_bytes=1 << 20, idle_seconds=30)  # fmt: skip
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            stub.Predict(_small_request(), timeout=limit(30))
            stub.Predict(_small_request(), timeout=limit(30))
            with pytest.raises(grpc.RpcError):
                stub.Predict(_small_request(name="other"), timeout=limit(30))
            model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
                get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "m"}),
                timeout=limit(30),
            )
            with pytest.raises(grpc.RpcError):  # no metadata_field: refused, still counted
                stub.GetModelMetadata(
                    get_model_metadata_pb2.GetModelMetadataRequest(model_spec={"name": "m"}),
                    timeout=limit(30),
                )
    finally:
        server.close()
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    counts = {(s.labels["model_name"], s.labels["status"]): s.value
              for s in families[":tensorflow:serving:request_count"].samples}  # fmt: skip
    assert counts == {("m", "OK"): 3, ("(unknown)", "NOT_FOUND"): 1,
                      ("m", "INVALID_ARGUMENT"): 1}  # fmt: skip
    totals = {(s.labels["model_name"], s.labels["API"], s.labels["entrypoint"]): s.value
              for s in families[":tensorflow:serving:request_latency"].samples
              if s.name.endswith("_count")}  # fmt: skip
    assert totals == {("m", "predict", "GRPC"): 2, ("(unknown)", "predict", "GRPC"): 1,
                      ("m", "GetModelStatus", "GRPC"): 1,
                      ("m", "GetModelMetadata", "GRPC"): 1}  # fmt: skip


def test_errors_that_echo_a_huge_request_keep_their_own_code_and_a_bounded_message(stubs):
    """A 4 MB model name, 3,000 input names: the answer's details are cut, so a default
    client reads NOT_FOUND and INVALID_ARGUMENT, not RESOURCE_EXHAUSTED for the trailers."""
    from serving.local.payload import MAX_MESSAGE_CHARS

    server = _serve(_Repository(), max_message_bytes=8 << 20)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as unknown:
                stub.Predict(_small_request(name="n" * (4 << 20)), timeout=limit(60))
            many = _small_request()
            for index in range(3000):
                many.inputs[f"input_{index:05d}"].CopyFrom(many.inputs["x"])
            with pytest.raises(grpc.RpcError) as mismatch:
                stub.Predict(many, timeout=limit(60))
            assert stub.Predict(_small_request(), timeout=limit(30)).outputs  # still serving
    finally:
        server.close()
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert mismatch.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for refused in (unknown.value, mismatch.value):
        details = refused.details()
        assert len(details) == MAX_MESSAGE_CHARS and details.endswith("..."), len(details)
    assert unknown.value.details().startswith("Servable not found for request: Latest(nnn")
    assert mismatch.value.details().startswith("input size does not match signature: 3001!=1")

def test_grpc_calls_to_unknown_models_add_no_series_however_many_names(stubs):
    """Names a client makes up, long ones too, are one series: memory and the page stay
    bounded by the models served."""
    metrics = ServingMetrics()
    app = GrpcApp(DataPlane(_Repository(), metrics=metrics))
    server = GrpcServer(app, "127.0.0.1", 0, threads=2, max_queued_requests=2,
                        max_message_bytes=1 << 20, idle_seconds=30)  # fmt: skip
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            stub.Predict(_small_request(), timeout=limit(30))
            for index in range(40):
                name = f"{index}-" + "x" * (100_000 if index % 10 == 0 else 10)
                with pytest.raises(grpc.RpcError):
                    stub.Predict(_small_request(name=name), timeout=limit(30))
    finally:
        server.close()
    page = metrics.exposition().decode()
    assert len(page) < 20_000  # two series of each metric, whatever the names were
    assert page.count('model_name="(unknown)",status="NOT_FOUND"} 40') == 1
    assert "xxxxxxxxxx" not in page and page.count("model_name=") == 2 * (1 + 1 + 33 + 1)


class _FaultyServable:
    """A stand-in version whose signature fails as no input can make it (a bug)."""

    version = 1
    signature_def = {"signature_def": {}}
    max_rank = 2

    def __init__(self):
        import tensorflow as tf

        def broken(x):
            raise RuntimeError("the graph's kernel is missing")

        self.signatures = {"serving_default": broken}
        self._spec = {"x": tf.TensorSpec([None, 2], tf.float32)}

    def input_specs(self, signature_name):
        return self._spec


def test_a_fault_is_internal_logged_with_the_api_and_model_and_the_server_keeps_serving(caplog):
    repository = _Repository(_FaultyServable())
    server = _serve(repository, threads=2, max_queued_requests=2)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with caplog.at_level(logging.ERROR, logger="serving"):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Predict(_small_request(), timeout=limit(30))
            assert refused.value.code() == grpc.StatusCode.INTERNAL
            assert refused.value.details() == "Internal: the graph's kernel is missing"
            (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert record.getMessage() == "Internal error on gRPC predict for model 'm'"
            assert "the graph's kernel is missing" in caplog.text  # the traceback
            repository.servable = _Servable()
            response = stub.Predict(_small_request(), timeout=limit(30))
            assert tensors.to_array(response.outputs["y"]).tolist() == [[2.0, 2.0]]
    finally:
        server.close()


def test_an_idle_connection_is_closed_after_idle_seconds():
    """TensorFlow Serving's idle limit: the server sends GOAWAY to a client that has been
    quiet for `idle_seconds`, and the client's channel goes back to IDLE (it reconnects
    on its next call)."""
    server = _serve(_Repository(), idle_seconds=0.5)
    states = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            stub.Predict(_small_request(), timeout=limit(30))
            channel.subscribe(states.append, try_to_connect=False)
            deadline = time.monotonic() + limit(15)
            while grpc.ChannelConnectivity.IDLE not in states[1:]:
                assert time.monotonic() < deadline, states
                time.sleep(0.05)
            assert states[0] == grpc.ChannelConnectivity.READY
            stub.Predict(_small_request(), timeout=limit(30))  # reconnects
            channel.unsubscribe(states.append)
    finally:
        server.close()


class _Servable:
    """A stand-in version: one signature `y = 2 x` that waits on `gate` when it is given."""

    version = 1
    signature_def = {"signature_def": {}}
    max_rank = 2

    def __init__(self, gate=None):
        import tensorflow as tf

        self.gate, self.started = gate, threading.Semaphore(0)

        def double(x):
            self.started.release()
            if self.gate is not None:
                self.gate.wait(30)
            return {"y": x * 2}

        self.signatures = {"serving_default": double}
        self._spec = {"x": tf.TensorSpec([None, 2], tf.float32)}

    def input_specs(self, signature_name):
        return self._spec


class _Repository:
    """A stand-in `ModelRepository` of one model `m` answering from `servable`."""

    def __init__(self, servable=None):
        self.servable = servable or _Servable()

    def serves(self, name):
        return name == "m"

    def get(self, name, version=None, label=None):
        if name != "m":
            raise RequestError(404, f"Servable not found for request: Latest({name})")
        return self.servable

    def status(self, name, version=None, label=None):
        return {
            "model_version_status": [
                {
                    "version": "1",
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ]
        }


def _small_request(name="m"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["x"].CopyFrom(tensors.to_tensor_proto(np.ones((1, 2), "float32")))
    return request


def _serve(repository, **limits):
    settings = dict(threads=1, max_queued_requests=1, max_message_bytes=1 << 20, idle_seconds=30)
    settings.update(limits)
    server = GrpcServer(GrpcApp(DataPlane(repository)), "127.0.0.1", 0, **settings)
    server.start()
    return server


def test_an_ipv6_host_is_bound_in_brackets_and_answers():
    """An IPv6 literal has colons of its own: the port is bound after `[host]`. The
    IPv4-mapped loopback is an IPv6 socket that still answers only on 127.0.0.1."""
    app = GrpcApp(DataPlane(_Repository()))
    server = GrpcServer(app, "::ffff:127.0.0.1", 0, threads=1, max_queued_requests=1,
                        max_message_bytes=1 << 20, idle_seconds=30)  # fmt: skip
    server.start()
    try:
        assert server.port > 0
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
                get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "m"}),
                timeout=limit(30),
            )
        assert status.model_version_status
    finally:
        server.close()


def test_each_answer_is_logged_at_debug_with_the_model_name_cut_to_200_characters(caplog):
    server = _serve(_Repository(), max_message_bytes=8 << 20)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with caplog.at_level(logging.DEBUG, logger="serving.local.grpcd"):
                with pytest.raises(grpc.RpcError):
                    stub.Predict(_small_request(name="n" * 5000), timeout=limit(30))
                stub.Predict(_small_request(), timeout=limit(30))
    finally:
        server.close()
    answers = [r.getMessage() for r in caplog.records if r.name == "serving.local.grpcd"
               and r.levelno == logging.DEBUG]  # fmt: skip
    assert answers == [f"gRPC predict {'n' * 200} -> NOT_FOUND", "gRPC predict m -> OK"]


def _call_in_thread(stub, results):
    def call():
        try:
            response = stub.Predict(_small_request(), timeout=limit(30))
            results.append(tensors.to_array(response.outputs["y"]).tolist())
        except grpc.RpcError as error:
            results.append(error.code().name)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_calls_beyond_the_workers_and_the_queue_are_refused_resource_exhausted():
    """One worker and one queued call: of two more calls while the worker is held, one
    waits and one is refused at once (whichever arrives second), not queued."""
    gate = threading.Event()
    servable = _Servable(gate)
    server = _serve(_Repository(servable), threads=1, max_queued_requests=1)
    results = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            calls = [_call_in_thread(stub, results)]
            assert servable.started.acquire(timeout=limit(30))  # the worker holds the first call
            calls += [_call_in_thread(stub, results), _call_in_thread(stub, results)]
            deadline = time.monotonic() + limit(30)
            while "RESOURCE_EXHAUSTED" not in results and time.monotonic() < deadline:
                time.sleep(0.01)
            assert results == ["RESOURCE_EXHAUSTED"]  # refused while the others still wait
            gate.set()
            for call in calls:
                call.join(30)
    finally:
        server.close()
    assert sorted(map(str, results)) == ["RESOURCE_EXHAUSTED", "[[2.0, 2.0]]", "[[2.0, 2.0]]"]


def test_a_call_that_ends_without_its_request_message_is_invalid_and_the_next_answered():
    """A client that half-closes the call without sending its message (zero messages on a
    unary method) gets INVALID_ARGUMENT saying so, at once, and the server goes on."""
    server = _serve(_Repository(), threads=1, max_queued_requests=2, receive_seconds=20.0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            empty = channel.stream_unary(
                "/tensorflow.serving.PredictionService/Predict",
                request_serializer=predict_pb2.PredictRequest.SerializeToString,
                response_deserializer=predict_pb2.PredictResponse.FromString,
            )
            opened = time.monotonic()
            with pytest.raises(grpc.RpcError) as refused:
                empty(iter(()), timeout=limit(30))
            assert time.monotonic() - opened < 10  # not at the 20 s receive limit
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details() == "The call carried no request message"
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            assert stub.Predict(_small_request(), timeout=limit(30)).outputs
    finally:
        server.close()


def test_calls_that_never_send_their_request_hold_no_worker_and_are_cut_off(caplog):
    """Two calls open without their request message (headers only) on a server of one
    worker: a real call is answered at once, and the silent ones are cancelled when
    their `receive_seconds` run out, not at their client's 30 s deadline."""
    server = _serve(_Repository(), threads=1, max_queued_requests=3, receive_seconds=1.0)
    release = threading.Event()

    def never_sent():
        release.wait(30)
        yield from ()

    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            silent = channel.stream_unary(
                "/tensorflow.serving.PredictionService/Predict",
                request_serializer=predict_pb2.PredictRequest.SerializeToString,
                response_deserializer=predict_pb2.PredictResponse.FromString,
            )
            with caplog.at_level(logging.INFO, logger="serving"):
                opened = time.monotonic()
                pending = [silent.future(never_sent(), timeout=limit(30)) for _ in range(2)]
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                response = stub.Predict(_small_request(), timeout=5)
                assert tensors.to_array(response.outputs["y"]).tolist() == [[2.0, 2.0]]
                codes = [call.exception(timeout=limit(20)).code() for call in pending]
                ended = time.monotonic() - opened
                assert stub.Predict(_small_request(), timeout=5).outputs  # still serving
                deadline = time.monotonic() + limit(10)  # the server's threads log after the cancel
                while sum("did not arrive" in m for m in caplog.messages) < 2:
                    assert time.monotonic() < deadline, caplog.messages
                    time.sleep(0.02)
    finally:
        release.set()
        server.close()
    assert codes == [grpc.StatusCode.CANCELLED] * 2
    assert 0.9 < ended < 20, ended
    cut = [m for m in caplog.messages if "did not arrive" in m]
    assert cut == ["gRPC /tensorflow.serving.PredictionService/Predict cancelled: its request "
                   "message did not arrive within 1 s"] * 2  # fmt: skip
    # Each cut-off call ends with the server's own CANCELLED: no handler failed.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


class _Busy(_Repository):
    """Refuses its first `busy` calls as RESOURCE_EXHAUSTED, then answers."""

    def __init__(self, busy):
        super().__init__()
        self.busy, self.calls = busy, 0

    def get(self, name, version=None, label=None):
        self.calls += 1
        if self.calls <= self.busy:
            raise RequestError(503, "busy", code="RESOURCE_EXHAUSTED")
        return super().get(name, version, label)


@pytest.mark.parametrize(
    "busy, retries, calls, answer",
    [(2, 3, 3, "[[2.0, 2.0]]"), (2, 1, 2, "RESOURCE_EXHAUSTED"), (1, 0, 1, "RESOURCE_EXHAUSTED"),
     (9, 9, 5, "RESOURCE_EXHAUSTED")],  # gRPC's most attempts: 5
)  # fmt: skip
def test_the_grpc_client_retries_a_busy_server_as_often_as_it_is_told(
    busy, retries, calls, answer
):
    repository = _Busy(busy)
    server = _serve(repository, threads=2)
    try:
        with GrpcClient(f"127.0.0.1:{server.port}", "m", timeout=limit(30), retries=retries,
                        backoff=0.01) as client:  # fmt: skip
            try:
                outputs = client.predict({"x": np.ones((1, 2), "float32")})["outputs"]
                got = str(outputs["y"].tolist())
            except ServingError as error:
                got = error.code
    finally:
        server.close()
    assert (got, repository.calls) == (answer, calls)


class _BusyEveryOther(_Repository):
    """Refuses every other call as UNAVAILABLE (draining): each call's first attempt."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def get(self, name, version=None, label=None):
        self.calls += 1
        if self.calls % 2:
            raise RequestError(503, "draining", code="UNAVAILABLE")
        return super().get(name, version, label)


@pytest.mark.parametrize("backoff", [0, 0.0001, 0.003])
def test_a_back_off_shorter_than_grpc_takes_still_retries_each_call(backoff):
    # gRPC's service config refuses a zero back-off (every call would fail as
    # INVALID_ARGUMENT) and below a millisecond; a few milliseconds lose retries.
    repository = _BusyEveryOther()
    server = _serve(repository, threads=2)
    answers = []
    try:
        with GrpcClient(f"127.0.0.1:{server.port}", "m", timeout=limit(10), retries=1,
                        backoff=backoff) as client:  # fmt: skip
            for _ in range(8):
                try:
                    outputs = client.predict({"x": np.ones((1, 2), "float32")})["outputs"]
                    answers.append(outputs["y"].tolist())
                except ServingError as error:
                    answers.append(error.code)
    finally:
        server.close()
    assert (answers, repository.calls) == ([[[2.0, 2.0]]] * 8, 16)


class _Version:
    """A stand-in version `number`: `serving_default` answers `y = number * x` (input `x` of
    `dtype`), and `stream` carries a state `h` that adds `number * x` summed over each
    chunk's steps (its output `total` is the new state)."""

    max_rank = 3

    def __init__(self, number, dtype="float32"):
        import tensorflow as tf

        self.version = number
        specs = {
            "serving_default": {"x": tf.TensorSpec([None, 2], tf.as_dtype(dtype))},
            "stream": {"sequence": tf.TensorSpec([None, None, 2], tf.float32),
                       "h": tf.TensorSpec([None, 2], tf.float32)},
        }  # fmt: skip
        self._specs = specs

        def stream(sequence, h):
            new = h + number * tf.reduce_sum(sequence, axis=1)
            return {"h": new, "total": tf.identity(new)}

        self.signatures = {"serving_default": lambda x: {"y": x * number}, "stream": stream}
        self.signature_def = {"signature_def": {
            name: {"inputs": {key: _tensor_info(key, spec) for key, spec in inputs.items()},
                   "outputs": {}, "method_name": "tensorflow/serving/predict"}
            for name, inputs in specs.items()}}  # fmt: skip

    def input_specs(self, signature_name):
        return self._specs[signature_name]


def _tensor_info(name, spec):
    """A `TensorInfo` as JSON, as the metadata of a SavedModel's signature writes it."""
    dims = [{"size": str(-1 if size is None else size)} for size in spec.shape]
    return {"name": f"{name}:0", "dtype": spec.dtype.as_datatype_enum,
            "tensor_shape": {"dim": dims}}  # fmt: skip


class _Versions(_Repository):
    """A stand-in model `m` serving every version in `versions` (`{number: _Version}`),
    the highest when none is asked for; a test may add one while it runs."""

    def __init__(self, *versions):
        super().__init__()
        self.versions = {version.version: version for version in versions}

    def get(self, name, version=None, label=None):
        super().get(name)  # a 404 for another name
        number = max(self.versions) if version is None else int(version)
        if number not in self.versions:
            raise RequestError(404, f"Servable not found for request: Specific({name}, {version})")
        return self.versions[number]


def test_the_grpc_client_reads_and_streams_the_version_asked_for():
    """With versions 1 and 2 served, a version named is the one that answers the metadata
    and every chunk of a stream; none named is the newest."""
    server = _serve(_Versions(_Version(1), _Version(2)), threads=2)
    x = np.random.default_rng(3).normal(size=(2, 5, 2)).astype("float32")
    chunks = [x[:, :2], x[:, 2:]]
    try:
        with GrpcClient(f"127.0.0.1:{server.port}", "m", timeout=limit(30)) as client:
            served = [client.metadata(v)["model_spec"]["version"] for v in (1, 2, None)]
            pinned = [step["total"] for step in client.stream(chunks, version=1)]
            newest = [step["total"] for step in client.stream(chunks)]
    finally:
        server.close()
    assert served == ["1", "2", "2"]
    for number, totals in ((1, pinned), (2, newest)):
        expected = [number * x[:, :2].sum(1), number * x.sum(1)]  # the state carried over
        np.testing.assert_allclose(totals, expected, rtol=1e-6)


def test_nested_lists_follow_the_dtypes_of_the_version_served_when_it_changes():
    """Lists take the signature's dtype: read again for the served version at each call (a
    newer version may take another dtype), once for a version named."""
    repository = _Versions(_Version(1, "float32"))
    server = _serve(repository, threads=2)
    x = [[1.5, -2.0]]
    try:
        with GrpcClient(f"127.0.0.1:{server.port}", "m", timeout=limit(30)) as client:
            first = client.predict(x)
            repository.versions[2] = _Version(2, "float64")
            newest = client.predict(x)
            named = client.predict(x, version=1)
    finally:
        server.close()
    got = [(answer["model_spec"]["version"], answer["outputs"]["y"].dtype.name,
            answer["outputs"]["y"].tolist()) for answer in (first, newest, named)]  # fmt: skip
    assert got == [("1", "float32", [[1.5, -2.0]]), ("2", "float64", [[3.0, -4.0]]),
                   ("1", "float32", [[1.5, -2.0]])]  # fmt: skip


def test_one_unnamed_tensor_for_a_signature_of_several_inputs_is_refused_naming_them():
    server = _serve(_Versions(_Version(1)))
    try:
        with GrpcClient(f"127.0.0.1:{server.port}", "m", timeout=limit(30)) as client:
            with pytest.raises(UsageError) as refused:
                client.predict(np.ones((1, 3, 2), "float32"), signature_name="stream")
    finally:
        server.close()
    assert str(refused.value) == (
        "Received an invalid value for argument `inputs`, expected a mapping of the inputs "
        "['h', 'sequence'], got one unnamed tensor."
    )


class _Aborted(Exception):
    pass


class _GoneContext:
    """A call's context whose client has gone: past its deadline, or cancelled."""

    def __init__(self, remaining, active):
        self.remaining, self.active, self.aborted = remaining, active, []

    def time_remaining(self):
        return self.remaining

    def is_active(self):
        return self.active

    def abort(self, code, details):
        self.aborted.append((code, details))
        raise _Aborted


@pytest.mark.parametrize(
    "remaining, active, code, details",
    [(0.0, True, "DEADLINE_EXCEEDED", "Deadline exceeded before the call was answered"),
     (-1.0, False, "DEADLINE_EXCEEDED", "Deadline exceeded before the call was answered"),
     (None, False, "CANCELLED", "The call was cancelled before it was answered"),
     (5.0, False, "CANCELLED", "The call was cancelled before it was answered")],
)  # fmt: skip
def test_a_call_whose_client_has_gone_is_aborted_with_its_code_and_counted(
    remaining, active, code, details
):
    metrics = ServingMetrics()
    app = GrpcApp(DataPlane(_Repository(), metrics=metrics))
    context = _GoneContext(remaining, active)
    request = get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "m"})
    with pytest.raises(_Aborted):
        app.GetModelStatus(request, context)
    assert context.aborted == [(getattr(grpc.StatusCode, code), details)]
    page = metrics.exposition().decode()
    assert f':tensorflow:serving:request_count{{model_name="m",status="{code}"}} 1' in page, page


def test_a_call_whose_deadline_passes_before_its_prediction_is_not_predicted():
    """Reading the call's version and inputs outlasts its 0.3 s deadline (a large request,
    a busy machine): the signature is not run for a client that has gone, the call counts
    as DEADLINE_EXCEEDED, and the next call is answered."""

    class SlowSpecs(_Servable):
        slow = True

        def input_specs(self, signature_name):
            if self.slow:
                time.sleep(0.8)
            return super().input_specs(signature_name)

    servable = SlowSpecs()
    metrics = ServingMetrics()
    app = GrpcApp(DataPlane(_Repository(servable), metrics=metrics))
    server = GrpcServer(app, "127.0.0.1", 0, threads=1, max_queued_requests=1,
                        max_message_bytes=1 << 20, idle_seconds=30)  # fmt: skip
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as late:
                stub.Predict(_small_request(), timeout=0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            deadline = time.monotonic() + limit(10)  # the server finishes the call after the client
            while "DEADLINE_EXCEEDED" not in metrics.exposition().decode():
                assert time.monotonic() < deadline, metrics.exposition().decode()[:600]
                time.sleep(0.05)
            assert not servable.started.acquire(timeout=0)  # the signature never ran
            servable.slow = False
            assert stub.Predict(_small_request(), timeout=limit(30)).outputs
            assert servable.started.acquire(timeout=0)
    finally:
        server.close()


def test_a_drain_answers_the_call_in_progress_and_refuses_new_ones(caplog):
    gate = threading.Event()
    servable = _Servable(gate)
    server = _serve(_Repository(servable), threads=2)
    results = []
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        call = _call_in_thread(stub, results)
        assert servable.started.acquire(timeout=limit(30))
        server.drain(10)
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as fresh:
            with pytest.raises(grpc.RpcError) as refused:
                prediction_service_pb2_grpc.PredictionServiceStub(fresh).Predict(
                    _small_request(), timeout=5
                )
        # Refused, not answered: UNAVAILABLE, or CANCELLED when the call raced the shutdown
        # inside grpcio.
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        gate.set()
        with caplog.at_level(logging.INFO, logger="serving"):
            assert server.wait_drained() == 0
        assert caplog.messages[-1] == "drained: every gRPC call in progress was answered"
        call.join(30)
    assert results == [[[2.0, 2.0]]]


def test_a_drain_that_runs_out_of_time_counts_the_call_it_cut_off(caplog):
    gate = threading.Event()
    servable = _Servable(gate)
    server = _serve(_Repository(servable))
    results = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            call = _call_in_thread(stub, results)
            assert servable.started.acquire(timeout=limit(30))
            server.drain(0.2)
            with caplog.at_level(logging.INFO, logger="serving"):
                assert server.wait_drained() == 1
            assert caplog.messages[-1] == "stopped draining with 1 gRPC calls unanswered"
            call.join(30)
    finally:
        gate.set()
        server.close()
    # No answer: the client sees the server go (grpcio's words for it vary with timing).
    assert results in (["UNAVAILABLE"], ["CANCELLED"])


def test_a_request_larger_than_max_body_bytes_is_resource_exhausted(served):
    _, server = served
    small = ThreadServer(server.server.settings.model_base_path, "stacked", grpc_port=0,
                         max_body_bytes=200)  # fmt: skip
    try:
        with GrpcClient(_target(small), "stacked", retries=0) as client:
            with pytest.raises(ServingError) as refused:
                client.predict({"sequence": _x(batch=4)})  # 4 x 12 x 3 float32: 576 bytes
            assert refused.value.code == "RESOURCE_EXHAUSTED"
            assert client.predict({"sequence": _x(batch=1)})["outputs"]  # 144 bytes: fine
    finally:
        small.stop()


def test_the_client_cli_speaks_grpc_and_prints_the_rest_api_s_json(served, capsys, tmp_path):
    _, server = served
    target = ["--grpc", _target(server), "--model", "stacked"]
    assert client_main([*target, "status"]) == 0
    assert json.loads(capsys.readouterr().out) == ServingClient(server.url, "stacked").status()
    x = _x(batch=2)
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"instances": [{"sequence": s.tolist(), "length": 4} for s in x],
                                "signature_name": "padded"}))  # fmt: skip
    assert client_main([*target, "predict", "--instances-file", str(rows)]) == 0
    printed = json.loads(capsys.readouterr().out)
    body = {"signature_name": "padded", "inputs": {"sequence": x.tolist(), "length": [4, 4]}}
    _, rest = http_call(f"{server.url}/v1/models/stacked:predict", "POST", body)
    assert printed["model_spec"] == {"name": "stacked", "version": "3",
                                     "signature_name": "padded"}  # fmt: skip
    assert printed["outputs"] == rest["outputs"]
    sequence = tmp_path / "x.npy"
    np.save(sequence, x[0])
    assert client_main([*target, "stream", "--sequence-file", str(sequence), "--chunk", "5"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["steps"] for line in lines] == [5, 10, T]
    model, _ = served
    np.testing.assert_allclose(lines[-1]["logits"], model.predict(x[:1], verbose=0)[0], atol=1e-5)


@pytest.mark.parametrize(
    ("target", "status", "line"),
    [
        ("127.0.0.1", 2, "Received an invalid value for argument `grpc`, expected HOST:PORT of a "
         "gRPC endpoint, e.g. 127.0.0.1:8500, got '127.0.0.1'."),
        ("http://127.0.0.1:8500", 2, "expected HOST:PORT of a gRPC endpoint"),
        ("127.0.0.1:0", 2, "expected HOST:PORT of a gRPC endpoint"),
        ("127.0.0.1:9", 1, "UNAVAILABLE from 127.0.0.1:9: "),
    ],
)  # fmt: skip
def test_a_bad_or_unreachable_grpc_target_is_one_line(capsys, target, status, line):
    argv = ["--grpc", target, "--model", "m", "--retries", "0", "--timeout", "5", "status"]
    assert client_main(argv) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err, err


def test_the_server_command_serves_grpc_and_a_taken_port_is_one_line_before_any_load(served):
    """A port another process holds, REST's or gRPC's, is refused naming its flag and the
    address, with status 2, before the model loads (no version is logged)."""
    _, server = served
    base = server.server.settings.model_base_path
    process = ServerProcess(base, "stacked")
    try:
        assert process.grpc_target is not None
        with GrpcClient(process.grpc_target, "stacked", timeout=limit(60)) as client:
            assert client.status()["model_version_status"][0]["state"] == "AVAILABLE"
    finally:
        process.stop()
    for flag, other in (("--grpc-port", "--port"), ("--port", "--grpc-port")):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            done = subprocess.run(
                [sys.executable, "-m", "serving.server", "--model-base-path", base,
                 "--model-name", "stacked", other, "0", flag, str(port)],
                cwd=REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                capture_output=True, text=True, timeout=limit(120),
            )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert "Serving version" not in done.stderr and "Warmed up" not in done.stderr
        (line,) = [line for line in done.stderr.splitlines() if ": error: " in line]
        assert line == (
            f"python -m serving.server: error: Received an invalid value for argument `{flag}`, "
            f"expected a port no other process holds on 127.0.0.1, got {port} (in use: "
            f"127.0.0.1:{port})."
        )


def test_a_grpc_port_out_of_range_is_refused_naming_the_flag(capsys, tmp_path):
    from serving.local import server as server_module

    argv = ["--model-base-path", str(tmp_path), "--model-name", "m", "--grpc-port", "65536"]
    assert server_module.main(argv) == 2
    assert capsys.readouterr().err == (
        "python -m serving.server: error: Received an invalid value for argument "
        "`--grpc-port`, expected 0 to 65535, got 65536.\n"
    )
