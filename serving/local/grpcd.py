"""TensorFlow Serving's gRPC API over a `ModelRepository`: `PredictionService.Predict`,
`PredictionService.GetModelMetadata` and `ModelService.GetModelStatus`.

The requests and answers are TensorFlow Serving's own protos (the
`tensorflow-serving-api` package), so a client written for a TensorFlow
Serving container talks to the local server unchanged, and the other way round.
Inputs are checked as over REST (`serving.local.payload`, `serving.local.tensors`): the
same signatures, the same limit of input numbers, the same messages; failures
carry TensorFlow Serving's canonical codes (`INVALID_ARGUMENT`, `NOT_FOUND`,
`FAILED_PRECONDITION`, ...). Every answer is counted in the server's metrics
under the entrypoint `GRPC`.

`GrpcServer` runs the services on grpcio's server: at most `threads` calls
answered at once and `threads + max_queued_requests` open (more are refused with
RESOURCE_EXHAUSTED, as over REST with 503), request messages of at most
`max_body_bytes` that must arrive within `request_timeout` of the call's start
(a call still without its message is cancelled, as REST cuts off a slow sender;
waiting for it holds no prediction worker), idle connections closed after
`channel_timeout`. A drain stops taking calls and lets the ones in progress finish.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from http import HTTPStatus
from typing import Any

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from apputil.net import host_port
from serving.local import tensors
from serving.local.payload import RequestError, bad_request
from serving.local.plane import DataPlane
from serving.names import DEFAULT_SIGNATURE

log = logging.getLogger(__name__)

#: The only metadata field TensorFlow Serving answers.
SIGNATURE_DEF_FIELD = "signature_def"


class GrpcApp(
    prediction_service_pb2_grpc.PredictionServiceServicer,
    model_service_pb2_grpc.ModelServiceServicer,
):
    """The servicer of both services: answers from a `DataPlane`.

    Classify, Regress, MultiInference and HandleReloadConfigRequest stay
    UNIMPLEMENTED, as the stubs' base classes answer.

    Args:
        plane: The `DataPlane` that answers (its repository, limits and metrics).
    """

    def __init__(self, plane: DataPlane):
        self.plane = plane
        self._lock = threading.Lock()
        self.in_flight = 0  # calls being answered: those a drain's end would cut off

    def Predict(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """`PredictionService.Predict`: a signature run on the request's `TensorProto`s."""
        return self._answer("predict", request.model_spec.name, context,
                            lambda: self._predict(request, context))  # fmt: skip

    def GetModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """`PredictionService.GetModelMetadata`: the served version's signature definitions."""
        return self._answer("GetModelMetadata", request.model_spec.name, context,
                            lambda: self._metadata(request))  # fmt: skip

    def GetModelStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """`ModelService.GetModelStatus`: every version folder and its state."""
        return self._answer("GetModelStatus", request.model_spec.name, context,
                            lambda: self._status(request))  # fmt: skip

    def _answer(
        self, api: str, name: str, context: grpc.ServicerContext, respond: Callable[[], Any]
    ) -> Any:
        """`respond()`, or the call aborted with its error's canonical code; counted and
        timed either way."""
        started = self.plane.clock()
        with self._lock:
            self.in_flight += 1
        code, message = "OK", ""
        try:
            _check_live(context)  # a call that waited for a worker past its deadline
            return respond()
        except RequestError as error:
            code, message = error.code, error.message
        except Exception as error:  # a real fault: answer INTERNAL and keep serving
            log.exception("Internal error on gRPC %s for model %r", api, name[:200])
            code, message = "INTERNAL", f"Internal: {error}"
        finally:
            with self._lock:
                self.in_flight -= 1
            log.debug("gRPC %s %s -> %s", api, name[:200], code)
            self.plane.record(name, api, code, started, entrypoint="GRPC")
        context.abort(grpc.StatusCode[code], message)  # raises: grpc answers with the code
        raise AssertionError("unreachable")

    def _servable(self, spec: Any) -> Any:
        """The servable a `ModelSpec` asks for (a version, a label, or the served one)."""
        return self.plane.servable(spec.name, *_version(spec))

    def _predict(self, request: Any, context: grpc.ServicerContext) -> Any:
        servable = self._servable(request.model_spec)
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        arrays = self.plane.inputs(servable, signature_name, request.inputs, tensors.input_array)
        wanted = list(request.output_filter)
        _check_live(context)  # reading a large request may have outlasted its deadline
        outputs = self.plane.run(servable, signature_name, arrays)
        for alias in wanted:
            if alias not in outputs:
                raise bad_request(
                    f"output tensor alias not found in signature: {alias} Outputs expected to "
                    f"be in the set {{{','.join(sorted(outputs))}}}."
                )
        response = predict_pb2.PredictResponse()
        _fill_spec(response.model_spec, request.model_spec.name, servable.version)
        response.model_spec.signature_name = signature_name
        for name in wanted or sorted(outputs):
            response.outputs[name].CopyFrom(tensors.to_tensor_proto(outputs[name]))
        return response

    def _metadata(self, request: Any) -> Any:
        fields = list(request.metadata_field)
        if not fields:
            raise bad_request("GetModelMetadataRequest must specify at least one metadata_field")
        for field in fields:
            if field != SIGNATURE_DEF_FIELD:
                raise bad_request(f"Metadata field {field} is not supported")
        servable = self._servable(request.model_spec)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        _fill_spec(response.model_spec, request.model_spec.name, servable.version)
        signatures = json_format.ParseDict(
            servable.signature_def, get_model_metadata_pb2.SignatureDefMap()
        )
        response.metadata[SIGNATURE_DEF_FIELD].Pack(signatures)
        return response

    def _status(self, request: Any) -> Any:
        spec = request.model_spec
        body = self.plane.status(spec.name, *_version(spec))  # the proto as JSON
        return json_format.ParseDict(body, get_model_status_pb2.GetModelStatusResponse())


def _version(spec: Any) -> tuple[str | None, str | None]:
    """`(version, label)` a `ModelSpec` names, as a REST path does (None, None: the served
    one)."""
    if not spec.name:
        raise bad_request("Missing ModelSpec")
    choice = spec.WhichOneof("version_choice")
    if choice == "version_label":
        return None, spec.version_label
    return (str(spec.version.value) if choice == "version" else None), None


def _check_live(context: grpc.ServicerContext) -> None:
    """Raises a `RequestError` (DEADLINE_EXCEEDED or CANCELLED) for a call whose client no
    longer waits for its answer, so that no prediction is run for nobody."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise RequestError(HTTPStatus.GATEWAY_TIMEOUT, "Deadline exceeded before the call was "
                        "answered", code="DEADLINE_EXCEEDED")  # fmt: skip
    if not context.is_active():
        raise RequestError(HTTPStatus.BAD_REQUEST, "The call was cancelled before it was answered",
                        code="CANCELLED")  # fmt: skip


def _fill_spec(spec: Any, name: str, version: int) -> None:
    spec.name = name
    spec.version.value = version


class _CallLimits(grpc.ServerInterceptor):
    """Each unary call's request message read within `receive_seconds`, then answered on one
    of `workers` slots.

    grpcio's synchronous server reads a unary call's message on the worker thread that
    then answers it, and waits for it without a deadline: a client that opens calls and
    never sends them would hold the workers. Served as request streams instead, the call
    reaches a thread at once, its message is awaited under a timer that cancels the call,
    and only then does it take a slot, so the pool (sized for the queue as well) is what
    silent calls hold, never the predictions.
    """

    def __init__(self, workers: int, receive_seconds: float):
        self._slots = threading.BoundedSemaphore(workers)
        self._receive_seconds = receive_seconds

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        behavior, method = handler.unary_unary, handler_call_details.method

        def answer(requests: Any, context: grpc.ServicerContext) -> Any:
            request = self._receive(requests, context, method)
            if not self._slots.acquire(timeout=context.time_remaining()):
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              "Deadline exceeded while the call waited for a worker")  # fmt: skip
            try:
                return behavior(request, context)
            finally:
                self._slots.release()

        return grpc.stream_unary_rpc_method_handler(
            answer,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _receive(self, requests: Any, context: grpc.ServicerContext, method: str) -> Any:
        """The call's request message; the call cancelled if it is not in within
        `receive_seconds`."""
        late = threading.Event()

        def cut_off() -> None:
            late.set()
            context.cancel()

        timer = threading.Timer(self._receive_seconds, cut_off)
        timer.daemon = True
        timer.start()
        try:
            request = next(requests, None)
        except grpc.RpcError:  # cancelled, by its client or by the timer
            request = None
        finally:
            timer.cancel()
        if late.is_set():  # a message that came with the cancel is too late all the same
            log.info("gRPC %s cancelled: its request message did not arrive within %g s",
                     method, self._receive_seconds)  # fmt: skip
        if late.is_set() or not context.is_active():
            context.abort(grpc.StatusCode.CANCELLED, "The call was cancelled before its request")
        if request is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "The call carried no request message")
        return request


class GrpcServer:
    """`GrpcApp` on a grpcio server bound to `host:port`, with the local server's limits.

    Args:
        app: The servicer.
        host: Interface to bind.
        port: TCP port (0: any free one; see `port` after binding).
        threads: Calls answered at once.
        max_queued_requests: Calls that may wait for a worker (or for their request
            message); more are refused with RESOURCE_EXHAUSTED.
        max_message_bytes: The largest request message accepted.
        idle_seconds: Seconds an idle connection is kept open.
        receive_seconds: Seconds from a call's start for its request message to
            arrive; a call without it by then is cancelled.

    Raises:
        OSError: the address cannot be bound (also when another process holds the
            port: the socket is not shared with SO_REUSEPORT).
    """

    def __init__(
        self,
        app: GrpcApp,
        host: str,
        port: int,
        threads: int,
        max_queued_requests: int,
        max_message_bytes: int,
        idle_seconds: float,
        receive_seconds: float = 30.0,
    ):
        self.app = app
        opened = threads + max_queued_requests
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=opened, thread_name_prefix="grpc-worker"),
            interceptors=[_CallLimits(threads, receive_seconds)],
            maximum_concurrent_rpcs=opened,
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.max_connection_idle_ms", int(idle_seconds * 1000)),
            ],
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(app, self.server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(app, self.server)
        address = host_port(host, port)
        try:
            bound = self.server.add_insecure_port(address)
        except RuntimeError as error:  # grpcio raises where older versions returned 0
            raise OSError(f"cannot bind gRPC to {address}: {error}") from None
        if not bound:
            raise OSError(f"cannot bind gRPC to {address}: the address is in use")
        self.host, self.port = host, bound
        self._stopped: threading.Event | None = None
        self._drain_deadline: float | None = None

    def start(self) -> None:
        """Start answering calls (from grpcio's own threads)."""
        self.server.start()

    def drain(self, seconds: float) -> None:
        """Refuse new calls and let those in progress finish within `seconds`; a second
        call cancels them at once. Returns at once (safe in a signal handler: grpcio
        stops from its own thread)."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + seconds
            self._stopped = self.server.stop(grace=seconds)
        else:
            self.server.stop(grace=None)

    def wait_drained(self) -> int:
        """After `drain`: waits for its end, logs it; returns how many calls it cut off."""
        if self._stopped is None or self._drain_deadline is None:
            return 0
        self._stopped.wait(max(self._drain_deadline - time.monotonic(), 0.0) + 1.0)
        dropped = self.app.in_flight
        if dropped:
            log.warning("stopped draining with %d gRPC calls unanswered", dropped)
        else:
            log.info("drained: every gRPC call in progress was answered")
        return dropped

    def close(self) -> None:
        """Stop at once (cancelling calls in progress) and release the port."""
        self.server.stop(grace=None).wait(10)
