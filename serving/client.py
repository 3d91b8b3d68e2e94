r"""A small client and CLI for TensorFlow Serving's REST and gRPC APIs (and `serving.server`).

    python -m serving.client --url http://127.0.0.1:8501 --model antisym status
    python -m serving.client --url http://127.0.0.1:8501 --model antisym metadata
    python -m serving.client --url http://127.0.0.1:8501 --model antisym predict \
        --instances-file batch.json [--columnar] [--version 2]
    python -m serving.client --model antisym stream --sequence-file x.npy --chunk 28
    python -m serving.client --grpc 127.0.0.1:8500 --model antisym stream --sequence-file x.npy

Prints the JSON response. `--grpc HOST:PORT` sends every command over TensorFlow
Serving's gRPC API instead (`GrpcClient`: tensors as their bytes, answers
printed as the REST API's JSON; a predict's instances are sent as columns).
`--instances-file` holds a TensorFlow Serving request body as curl would send
it (`{"instances": [...]}` or `{"inputs": ...}`, with an optional
`signature_name`), or a bare JSON list of instances (sent as `instances`, or as
`inputs` with `--columnar`). `stream` sends a numeric `.npy`
sequence (`(T, m)`, or `(batch, T, m)`) to the `stream` signature `--chunk`
steps at a time, carrying the recurrent states from answer to request, and
prints one JSON line per chunk. Errors are one line on stderr: status 2 for
invalid arguments (or an unreadable `--instances-file` or `--sequence-file`),
1 when the server answers with an error or does not answer. Output piped into
a reader that stops early (`| head`) ends the command quietly, with status 141
(128 + SIGPIPE) as Unix tools end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from http import HTTPStatus
from typing import Any

import numpy as np

from apputil.cli import EXIT_FAILURE, OneLineParser, finish, run
from apputil.errors import Literal, invalid
from serving import protos, tensors
from serving.codes import status_name
from serving.names import (
    DEFAULT_SIGNATURE,
    SEQUENCE_INPUT,
    STREAM_SIGNATURE,
    check_model_name,
    unknown_signature,
)

DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_CHUNK = 28


class ServingError(Exception):
    """A request the server answered with an error (or that never got an answer).

    Attributes:
        status: The HTTP status code (REST), or `None` over gRPC or when no response
            arrived.
        code: The canonical code (`NOT_FOUND`, ...): gRPC's, or the HTTP status'
            (`serving.codes`); `None` when no response arrived.
        message: The server's message, or the transport error.
        url: Where the request went (a URL, or gRPC's `HOST:PORT`).
    """

    def __init__(self, status: int | None, message: str, url: str, code: str | None = None):
        if code is None and status is not None:
            code = status_name(status)
        where = f"HTTP {status} from {url}" if status else f"{code} from {url}" if code else url
        super().__init__(f"{where}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.url = url


def _check_url(url: object) -> str:
    """`url` if it is an http(s) URL with a host and a valid port, else a `UsageError`."""
    expected = "an http:// or https:// URL with a host, e.g. http://127.0.0.1:8501"
    try:
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        valid = parts and parts.scheme in ("http", "https") and parts.hostname and parts.port != 0
    except ValueError:  # a port out of range or not a number
        valid = False
    if not valid or not isinstance(url, str):
        raise invalid("url", expected, url)
    return url


class _StreamingClient:
    """What the REST and gRPC clients share: the stream of chunks with the states carried
    from answer to request. A subclass answers `metadata(version)` as the REST API
    does and `_predict_stream(version, inputs)` with the `stream` signature's outputs."""

    model: str

    def metadata(self, version: int | None = None) -> dict:
        raise NotImplementedError

    def _where(self, version: int) -> str:
        raise NotImplementedError

    def _predict_stream(self, version: int, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        raise NotImplementedError

    def stream_states(self, version: int | None = None) -> tuple[int, dict[str, int]]:
        """`(version, {state input: units})` of the served `stream` signature.

        Raises:
            NoStreamSignatureError: the version has no `stream` signature.
        """
        metadata = self.metadata(version)
        served = int(metadata["model_spec"]["version"])
        signatures = metadata["metadata"]["signature_def"]["signature_def"]
        if STREAM_SIGNATURE not in signatures:
            raise NoStreamSignatureError(
                None,
                f"version {served} of model {self.model!r} has no {STREAM_SIGNATURE!r} "
                "signature (exported with --no-stream, or a model that cannot stream)",
                self._where(served),
            )
        inputs = signatures[STREAM_SIGNATURE]["inputs"]
        states = {
            name: int(info["tensor_shape"]["dim"][-1]["size"])
            for name, info in sorted(inputs.items())
            if name != SEQUENCE_INPUT
        }
        return served, states

    def stream(self, chunks: Iterable[Any], version: int | None = None) -> Iterator[dict]:
        """Send `chunks` one after another to the `stream` signature, carrying the states.

        The version is read once and pinned: a newer version loaded meanwhile
        must not receive states of another model (its removal ends the stream
        with a NOT_FOUND `ServingError`). Each request is independent on the server,
        so the retries of overloaded answers are as safe as for `predict`.

        Args:
            chunks: Arrays or nested lists, each `(t, m)` for one sequence or
                `(batch, t, m)` for a batch (the same batch size throughout).
            version: Optional integer version; the served one when `None`.

        Yields:
            The head's outputs after each chunk (states left out), for one
            sequence without the batch axis: nested lists over REST, arrays over gRPC.
        """
        version, sizes = self.stream_states(version)
        states: dict[str, Any] | None = None
        for chunk in chunks:
            try:
                batch = np.asarray(chunk, "float32")
            except (ValueError, TypeError):  # ragged, or not numbers
                batch = np.zeros(0)
            single = batch.ndim == 2
            if single:
                batch = batch[None]
            if batch.ndim != 3 or 0 in batch.shape:
                raise invalid("chunks", "arrays of shape (t, m) or (batch, t, m)", _tolist(chunk))
            if states is None:
                states = {name: np.zeros((len(batch), size), "float32")
                          for name, size in sizes.items()}  # fmt: skip
            # float32, as the signature takes them.
            arrays = {name: np.asarray(value, "float32") for name, value in states.items()}
            outputs = self._predict_stream(version, {SEQUENCE_INPUT: batch, **arrays})
            states = {name: outputs[name] for name in sizes}
            answer = {name: value for name, value in outputs.items() if name not in sizes}
            yield {name: value[0] for name, value in answer.items()} if single else answer


class ServingClient(_StreamingClient):
    """Calls one model of a TensorFlow Serving REST endpoint.

    Args:
        url: Base URL, e.g. `http://127.0.0.1:8501`.
        model: The model name.
        timeout: Seconds to wait for each response.
        retries: How many times to retry a 503 (model loading, overloaded).
        backoff: Seconds before the first retry, doubled after each.
    """

    def __init__(
        self,
        url: str,
        model: str,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        retries: int = 3,
        backoff: float = 0.2,
    ):
        _check_retries(retries, timeout)
        self.url = _check_url(url).rstrip("/")
        self.model = check_model_name(model, "model")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    def _model_url(self, version: int | None = None) -> str:
        path = f"{self.url}/v1/models/{self.model}"
        return path if version is None else f"{path}/versions/{int(version)}"

    def request(self, method: str, url: str, body: Any = None) -> Any:
        """Send one request; return the decoded JSON or raise `ServingError`.

        Args:
            method: `"GET"` or `"POST"`.
            url: The full URL.
            body: A JSON-serialisable object for POST, or raw `bytes`.

        Returns:
            The decoded JSON response.
        """
        data = body if isinstance(body, bytes) or body is None else encode_json(body)
        delay = self.backoff
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(url, data=data, method=method)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as error:
                status, message = error.code, _error_message(error)
                if status == HTTPStatus.SERVICE_UNAVAILABLE and attempt < self.retries:
                    time.sleep(delay)
                    delay *= 2
                    continue
                raise ServingError(status, message, url) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                raise ServingError(None, str(getattr(error, "reason", error)), url) from None
        raise AssertionError("unreachable")

    def status(self, version: int | None = None) -> dict:
        """`GET /v1/models/NAME[/versions/V]`: the model version status."""
        return self.request("GET", self._model_url(version))

    def metadata(self, version: int | None = None) -> dict:
        """`GET /v1/models/NAME[/versions/V]/metadata`: the signature definitions."""
        return self.request("GET", self._model_url(version) + "/metadata")

    def predict(
        self,
        instances: Any = None,
        inputs: Any = None,
        version: int | None = None,
        signature_name: str | None = None,
    ) -> dict:
        """`POST /v1/models/NAME[/versions/V]:predict` in row or columnar format.

        Args:
            instances: Row format: a list with one entry per example.
            inputs: Columnar format: a tensor or `{input_name: tensor}`.
            version: Optional integer version; the newest when `None`.
            signature_name: Optional signature; `serving_default` when `None`.

        Returns:
            `{"predictions": ...}` for `instances`, `{"outputs": ...}` for `inputs`.
        """
        if (instances is None) == (inputs is None):
            given = "both" if instances is not None else "neither"
            raise invalid("instances", "exactly one of `instances` and `inputs`", Literal(given))
        body = {"instances": instances} if instances is not None else {"inputs": inputs}
        if signature_name is not None:
            body["signature_name"] = signature_name
        return self.request("POST", self._model_url(version) + ":predict", body)

    def _where(self, version: int) -> str:
        return self._model_url(version)

    def _predict_stream(self, version: int, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        body = {"signature_name": STREAM_SIGNATURE, "inputs": inputs}
        return self.request("POST", self._model_url(version) + ":predict", body)["outputs"]


def _check_target(target: object) -> str:
    """`target` if it is a gRPC `HOST:PORT` (IPv6 in brackets), else a `UsageError`."""
    text = target if isinstance(target, str) else ""
    host, _, port = text.rpartition(":")
    if not (host and port.isdigit() and 0 < int(port) < 65536 and "/" not in text):
        raise invalid("grpc", "HOST:PORT of a gRPC endpoint, e.g. 127.0.0.1:8500", target)
    return text


class GrpcClient(_StreamingClient):
    """Calls one model of a TensorFlow Serving gRPC endpoint (`PredictionService`,
    `ModelService`), with TensorFlow Serving's own protos.

    Tensors travel as their bytes (`serving.tensors`): a float32 array arrives as
    the same float32 numbers, and nothing is formatted or parsed as text.

    Args:
        target: `HOST:PORT`, e.g. `127.0.0.1:8500`.
        model: The model name.
        timeout: Seconds to wait for each answer (the call's deadline).
        retries: How many times to retry a call refused as RESOURCE_EXHAUSTED
            (too many calls at once) or UNAVAILABLE (not reachable yet, draining),
            at most 4 (grpcio's retry policy: 5 attempts in all); within `timeout`.
        backoff: Seconds of the first retry's back-off (gRPC jitters it), doubled
            after each.
    """

    def __init__(
        self,
        target: str,
        model: str,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        retries: int = 3,
        backoff: float = 0.2,
    ):
        _check_retries(retries, timeout)
        self.target = _check_target(target)
        self.model = check_model_name(model, "model")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        # Heavy, and needed only here: the REST client runs without them.
        import grpc

        self._grpc, self._protos = grpc, protos.load()  # the protos without TensorFlow
        self.channel = grpc.insecure_channel(self.target, options=_retry_options(retries, backoff))
        self._prediction = self._protos.prediction_service_pb2_grpc.PredictionServiceStub(
            self.channel
        )
        self._models = self._protos.model_service_pb2_grpc.ModelServiceStub(self.channel)
        self._input_dtypes: dict[tuple[int | None, str], dict[str, str]] = {}

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _where(self, version: int) -> str:
        return self.target

    def call(self, method: Any, request: Any) -> Any:
        """`method(request)` within the deadline, retried by the channel's policy; a
        `ServingError` with the canonical code when the server refuses it or cannot be
        reached."""
        try:
            return method(request, timeout=self.timeout)
        except self._grpc.RpcError as error:
            code = error.code()
            raise ServingError(None, error.details() or code.name, self.target,
                               code=code.name) from None  # fmt: skip

    def _spec(self, request: Any, version: int | None, signature_name: str | None = None) -> None:
        request.model_spec.name = self.model
        if version is not None:
            request.model_spec.version.value = int(version)
        if signature_name is not None:
            request.model_spec.signature_name = signature_name

    def status(self, version: int | None = None) -> dict:
        """`ModelService.GetModelStatus`, as the REST API's JSON body."""
        from google.protobuf import json_format

        request = self._protos.get_model_status_pb2.GetModelStatusRequest()
        self._spec(request, version)
        return _as_json(json_format, self.call(self._models.GetModelStatus, request))

    def metadata(self, version: int | None = None) -> dict:
        """`PredictionService.GetModelMetadata` (the signature definitions), as the REST
        API's JSON body."""
        from google.protobuf import json_format

        get_model_metadata_pb2 = self._protos.get_model_metadata_pb2
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        self._spec(request, version)
        response = self.call(self._prediction.GetModelMetadata, request)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signatures)
        spec = _as_json(json_format, response.model_spec)
        spec.setdefault("signature_name", "")
        return {
            "model_spec": spec,
            "metadata": {"signature_def": _as_json(json_format, signatures)},
        }

    def predict(
        self,
        inputs: Any,
        version: int | None = None,
        signature_name: str | None = None,
    ) -> dict:
        """`PredictionService.Predict`: `{"model_spec": ..., "outputs": {name: array}}`.

        Args:
            inputs: `{input name: array}`, or one array for a signature of one input.
                NumPy arrays are sent with their dtype (the signature's must match);
                nested lists take the signature's dtype (read once per version).
            version: Optional integer version; the newest when `None`.
            signature_name: Optional signature; `serving_default` when `None`.
        """
        predict_pb2 = self._protos.predict_pb2
        signature = signature_name or DEFAULT_SIGNATURE
        named = inputs if isinstance(inputs, dict) else None
        if named is None or any(not isinstance(v, np.ndarray) for v in named.values()):
            dtypes = self._dtypes(version, signature)
            if named is None:
                if len(dtypes) != 1:
                    raise invalid("inputs", f"a mapping of the inputs {sorted(dtypes)}",
                                  Literal("one unnamed tensor"))  # fmt: skip
                named = {next(iter(dtypes)): inputs}
            named = {name: value if isinstance(value, np.ndarray)
                     else np.asarray(value, dtypes.get(name, "float32"))
                     for name, value in named.items()}  # fmt: skip
        request = predict_pb2.PredictRequest()
        self._spec(request, version, signature_name)
        for name, value in named.items():
            request.inputs[name].CopyFrom(tensors.to_tensor_proto(value))
        response = self.call(self._prediction.Predict, request)
        return {
            "model_spec": {"name": response.model_spec.name,
                           "version": str(response.model_spec.version.value),
                           "signature_name": response.model_spec.signature_name},
            "outputs": {name: tensors.to_array(value, name)
                        for name, value in response.outputs.items()},
        }  # fmt: skip

    def _dtypes(self, version: int | None, signature: str) -> dict[str, str]:
        """`{input: NumPy dtype name}` of a signature of the served (or given) version; a
        given version's are read once, the served one's at each call (it may change)."""
        if (version, signature) in self._input_dtypes:
            return self._input_dtypes[(version, signature)]
        metadata = self.metadata(version)
        key = (int(metadata["model_spec"]["version"]), signature)
        if key not in self._input_dtypes:
            signatures = metadata["metadata"]["signature_def"]["signature_def"]
            if signature not in signatures:
                message = unknown_signature(signature, signatures)
                raise ServingError(None, message, self.target, code="FAILED_PRECONDITION")
            self._input_dtypes[key] = {
                name: _NUMPY_DTYPES.get(info["dtype"], "float32")
                for name, info in signatures[signature]["inputs"].items()
            }
        if version is not None:
            self._input_dtypes[(version, signature)] = self._input_dtypes[key]
        return self._input_dtypes[key]

    def _predict_stream(self, version: int, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        return self.predict(inputs, version, STREAM_SIGNATURE)["outputs"]


_NUMPY_DTYPES = {"DT_FLOAT": "float32", "DT_DOUBLE": "float64", "DT_HALF": "float16",
                 "DT_INT32": "int32", "DT_INT64": "int64"}  # fmt: skip


#: gRPC's most attempts of a call: `maxAttempts` above it count as this.
MAX_GRPC_ATTEMPTS = 5


def _retry_options(retries: int, backoff: float) -> list[tuple[str, Any]]:
    """The channel options of grpcio's own retry policy: RESOURCE_EXHAUSTED and
    UNAVAILABLE retried `retries` times (at most 4: gRPC's limit of 5 attempts), with
    jittered back-off from `backoff` seconds, doubling; the call's deadline covers them all."""
    if retries == 0:
        return [("grpc.enable_retries", 0)]
    policy = {
        "maxAttempts": min(retries + 1, MAX_GRPC_ATTEMPTS),
        "initialBackoff": f"{backoff}s",
        "maxBackoff": f"{max(backoff, 10.0)}s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["RESOURCE_EXHAUSTED", "UNAVAILABLE"],
    }
    config = {"methodConfig": [{"name": [{}], "retryPolicy": policy}]}
    return [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]


def _as_json(json_format: Any, message: Any) -> dict:
    """A proto as TensorFlow Serving's REST API writes it: field names kept, defaults shown."""
    return json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )


def _check_retries(retries: object, timeout: object) -> None:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise invalid("retries", "a non-negative integer", retries)
    if not timeout or not isinstance(timeout, int | float) or timeout <= 0:
        raise invalid("timeout", "a positive number of seconds", timeout)


class NoStreamSignatureError(ServingError):
    """The served model version has no `stream` signature."""


def stream(
    url: str,
    chunks: Iterable[Any],
    model: str,
    version: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    retries: int = 3,
    backoff: float = 0.2,
) -> Iterator[dict]:
    """`ServingClient(url, model, timeout, retries, backoff).stream(chunks, version)`.

    Args:
        url: Base URL, e.g. `http://127.0.0.1:8501`.
        chunks: As in `ServingClient.stream`.
        model: The model name.
        version: Optional integer version; the served one when `None`.
        timeout: Seconds to wait for each response.
        retries: How many times to retry a 503.
        backoff: Seconds before the first retry, doubled after each.

    Yields:
        The head's outputs after each chunk, as `ServingClient.stream`.
    """
    client = ServingClient(url, model, timeout, retries, backoff)
    yield from client.stream(chunks, version)


def encode_json(value: Any) -> bytes:
    """`value` as a JSON request body; NumPy arrays and scalars as numbers.

    A float32 number is written in the shortest form that reads back as the same
    float32 (`0.1`, not the `0.10000000149011612` of its float64 value): the server
    casts to float32, so nothing is lost, and the body is about half as long.
    """
    return _json(value).encode()


def _json(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.dtype == np.float32:
            return _float32_json(value)
        return json.dumps(value.tolist(), separators=(",", ":"))
    if isinstance(value, np.generic):
        return _float32_json(np.asarray(value)) if value.dtype == np.float32 else json.dumps(
            value.item()
        )  # fmt: skip
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_json(v) for v in value) + "]"
    return json.dumps(value, separators=(",", ":"))


def _float32_json(array: np.ndarray) -> str:
    if array.ndim == 0:
        number = array.item()
        # NumPy writes a float32 in its shortest round-trip form; JSON has no inf or nan
        # (json.dumps's NaN and Infinity, which the server refuses, say what was sent).
        return str(array[()]) if np.isfinite(number) else json.dumps(number)
    return "[" + ",".join(_float32_json(row) for row in array) + "]"


def _tolist(value: Any) -> Any:
    """Nested NumPy arrays (or anything with `tolist`) as JSON-ready lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _tolist(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tolist(v) for v in value]
    return value


def _error_message(error: urllib.error.HTTPError) -> str:
    """The `{"error": ...}` message of an HTTP error response, else its raw text."""
    raw = error.read().decode("utf-8", "replace")
    try:
        return json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return raw or error.reason


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints the JSON response and returns the exit status."""
    parser = OneLineParser(
        prog="python -m serving.client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default="http://127.0.0.1:8501")
    parser.add_argument(
        "--grpc", metavar="HOST:PORT",
        help="call the gRPC API there (e.g. 127.0.0.1:8500) instead of REST at --url",
    )  # fmt: skip
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", type=int)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("command", choices=["status", "metadata", "predict", "stream"])
    parser.add_argument(
        "--instances-file",
        help='a request body ({"instances": ...} or {"inputs": ...}) or a JSON list (predict)',
    )
    parser.add_argument("--columnar", action="store_true", help="send them as `inputs`")
    parser.add_argument("--signature-name")
    parser.add_argument("--sequence-file", help=".npy sequence, (T, m) or (batch, T, m) (stream)")
    parser.add_argument(
        "--chunk",
        type=int,
        default=DEFAULT_CHUNK,
        help=f"steps per request (default {DEFAULT_CHUNK})",
    )
    args = parser.parse_args(argv)
    try:
        return run(parser.prog, lambda: _call(args), {ServingError: EXIT_FAILURE})
    except BrokenPipeError:  # the reader is gone: nothing left to say, and no one to say it to
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would fail again
        os.close(devnull)
        return 128 + signal.SIGPIPE


def _call(args: argparse.Namespace) -> None:
    """Sends the command's request and prints the JSON answer."""
    client: ServingClient | GrpcClient
    if args.grpc is not None:
        client = GrpcClient(args.grpc, args.model, args.timeout, args.retries)
    else:
        client = ServingClient(args.url, args.model, args.timeout, args.retries)
    if args.command == "stream":
        _stream(client, args)
        return
    if args.command == "status":
        result = client.status(args.version)
    elif args.command == "metadata":
        result = client.metadata(args.version)
    else:
        key, batch, signature_name = _read_request(args.instances_file, args.columnar)
        signature_name = args.signature_name or signature_name
        if isinstance(client, GrpcClient):  # gRPC has only the columnar format
            inputs = _rows_to_columns(batch) if key == "instances" else batch
            result = _tolist(client.predict(inputs, args.version, signature_name))
        else:
            result = client.predict(**{key: batch}, version=args.version,
                                    signature_name=signature_name)  # fmt: skip
    json.dump(result, sys.stdout, indent=2)
    print()


def _rows_to_columns(rows: Any) -> Any:
    """Instances (one per example; objects for several inputs) as columnar inputs."""
    if isinstance(rows, list) and rows and all(isinstance(row, dict) for row in rows):
        names = rows[0].keys()
        if any(row.keys() != names for row in rows):
            raise invalid("--instances-file", "instances with the same keys",
                          Literal(", ".join(sorted({str(sorted(r)) for r in rows}))))  # fmt: skip
        return {name: [row[name] for row in rows] for name in names}
    return rows


def _stream(client: _StreamingClient, args: argparse.Namespace) -> None:
    """Streams `--sequence-file` in `--chunk`-step chunks; one JSON line per answer."""
    if isinstance(args.chunk, bool) or args.chunk < 1:
        raise invalid("--chunk", "a positive number of steps", args.chunk)
    sequence = _read_sequence(args.sequence_file)
    steps = sequence.shape[-2]
    starts = range(0, steps, args.chunk)
    chunks = (sequence[..., start : start + args.chunk, :] for start in starts)
    for start, answer in zip(starts, client.stream(chunks, args.version), strict=False):
        seen = min(start + args.chunk, steps)
        print(json.dumps({"steps": seen, **_tolist(answer)}), flush=True)


def _read_sequence(path: str | None) -> Any:
    """The `--sequence-file` array, `(T, m)` or `(batch, T, m)`, or a one-line usage error."""
    import numpy as np  # only `stream` reads arrays

    if not path:
        raise invalid("--sequence-file", "a .npy file for `stream`", Literal("none"))
    try:
        sequence = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise invalid(
            "--sequence-file", "a readable .npy file", Literal(f"{path!r} ({error})")
        ) from None
    if not isinstance(sequence, np.ndarray):  # an .npz archive: several named arrays
        names = ", ".join(sequence.files)
        sequence.close()
        raise invalid(
            "--sequence-file",
            "a .npy file holding one array (np.save)",
            Literal(f"{path!r}, an .npz archive of {names or 'no arrays'}"),
        )
    if sequence.dtype.kind not in "biuf":
        raise invalid(
            "--sequence-file",
            "a .npy file of numbers",
            Literal(f"{path!r} of dtype {sequence.dtype}"),
        )
    if sequence.ndim not in (2, 3) or 0 in sequence.shape:
        raise invalid(
            "--sequence-file",
            "a non-empty array of shape (T, m) or (batch, T, m)",
            Literal(f"{path!r} of shape {sequence.shape}"),
        )
    return sequence.astype("float32")


def _read_request(path: str | None, columnar: bool) -> tuple[str, Any, str | None]:
    """`(key, batch, signature_name)` from `--instances-file`, or a one-line usage error.

    The file is a TensorFlow Serving request body (`{"instances": ...}` or
    `{"inputs": ...}`, maybe with `signature_name`) or a bare JSON list, sent
    as `inputs` when `columnar`, else as `instances`.
    """
    if not path:
        raise invalid("--instances-file", "a JSON file for `predict`", Literal("none"))
    try:
        with open(path, encoding="utf-8") as handle:
            body = json.load(handle)
    except (OSError, ValueError) as error:
        raise invalid(
            "--instances-file", "a readable JSON file", Literal(f"{path!r} ({error})")
        ) from None
    if isinstance(body, list):
        return ("inputs" if columnar else "instances"), body, None
    keys = [key for key in ("instances", "inputs") if isinstance(body, dict) and key in body]
    signature = body.get("signature_name") if isinstance(body, dict) else None
    if len(keys) != 1 or not isinstance(signature, str | None):
        raise invalid(
            "--instances-file",
            'a JSON list of instances or a request body {"instances": [...]} or '
            '{"inputs": ...} (with an optional string "signature_name")',
            Literal(f"{path!r} holding {_describe_json(body)}"),
        )
    (key,) = keys
    if columnar and key == "instances":
        raise invalid(
            "--columnar", 'no flag: the file\'s body names its format ("instances")', Literal(path)
        )
    return key, body[key], signature


def _describe_json(value: Any) -> str:
    if isinstance(value, dict):
        return "an object with keys " + (", ".join(sorted(map(repr, value))[:6]) or "none")
    return {str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


if __name__ == "__main__":
    finish(main())
