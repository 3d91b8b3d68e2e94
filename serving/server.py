"""A local server for exported SavedModels that speaks TensorFlow Serving's REST subset.

    python -m serving.server --model-base-path models/antisym --model-name antisym --port 8501

Serves the newest version under `--model-base-path` (like TensorFlow Serving's
default `latest` policy) and picks up new version folders without a restart.
Answers `GET /v1/models/NAME[/versions/V][/metadata]` and
`POST /v1/models/NAME[/versions/V]:predict` with TensorFlow Serving's JSON
formats, status codes and `{"error": ...}` bodies. It imports TensorFlow only
(no Keras), binds to 127.0.0.1, caps the request size and does no batching:
it is for laptops, demos and tests; production uses the container.
"""

import argparse
import json
import logging
import math
import os
import re
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import saved_model_pb2

log = logging.getLogger("serving.server")

DEFAULT_SIGNATURE = "serving_default"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# A refused (413) body is still read, up to this many times the cap and seconds, so
# that the client sees the answer instead of a reset connection.
LINGER_FACTOR = 4
LINGER_SECONDS = 5.0
_PATH = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?"
    r"(?:(?P<metadata>/metadata)|(?P<verb>:[A-Za-z]+))?/?$"
)
_NUMPY_DTYPES = {
    tf.float32: np.float32,
    tf.float64: np.float64,
    tf.int32: np.int32,
    tf.int64: np.int64,
}


class RestError(Exception):
    """A request failure answered as `{"error": message}` with an HTTP status."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = int(status)
        self.message = message


class Servable:
    """One loaded SavedModel version: its signatures and its metadata JSON.

    Args:
        path: The version folder (holding `saved_model.pb`).
        version: Integer version number.
    """

    def __init__(self, path, version):
        self.version = version
        self._module = tf.saved_model.load(path)  # kept alive: signatures reference it
        self.signatures = dict(self._module.signatures)
        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        # TensorFlow Serving prints the SignatureDefMap proto with field names kept
        # and default values included; so do we.
        self.signature_def = {
            "signature_def": {
                key: json_format.MessageToDict(
                    value,
                    always_print_fields_with_no_presence=True,
                    preserving_proto_field_name=True,
                )
                for key, value in proto.meta_graphs[0].signature_def.items()
            }
        }

    def input_specs(self, signature_name):
        """`{name: tf.TensorSpec}` of a signature's inputs, or a 400 `RestError`."""
        if signature_name not in self.signatures:
            raise RestError(
                HTTPStatus.BAD_REQUEST,
                f'Serving signature name: "{signature_name}" not found in signature def',
            )
        return self.signatures[signature_name].structured_input_signature[1]


class ModelRepository:
    """The versions of one model under a base path, newest one loaded and served.

    Args:
        base_path: Folder with one all-digit sub-folder per version.
        name: The model name in URLs.
        poll_seconds: Seconds between scans of `base_path` for new versions.
    """

    def __init__(self, base_path, name, poll_seconds=1.0):
        self.base_path = base_path
        self.name = name
        self.poll_seconds = poll_seconds
        self._current = None
        self._failed = {}  # version -> error message, not retried
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def _newest_version_on_disk(self):
        try:
            entries = os.listdir(self.base_path)
        except FileNotFoundError:
            return None
        versions = [
            int(e)
            for e in entries
            if e.isdigit() and os.path.isfile(os.path.join(self.base_path, e, "saved_model.pb"))
        ]
        versions = [v for v in versions if v not in self._failed]
        return max(versions, default=None)

    def refresh(self):
        """Load the newest version on disk if it is newer than the served one."""
        newest = self._newest_version_on_disk()
        current = self._current
        if newest is None or (current is not None and newest <= current.version):
            return
        try:
            servable = Servable(os.path.join(self.base_path, str(newest)), newest)
        except Exception as error:  # a broken export must not stop the served version
            log.error("Could not load version %s of %s: %s", newest, self.name, error)
            self._failed[newest] = str(error)
            return
        with self._lock:
            self._current = servable
        log.info("Serving version %s of model %s", newest, self.name)

    def start(self):
        """Load the newest version now and watch for new ones in a daemon thread."""
        self.refresh()
        self._thread = threading.Thread(target=self._watch, name="version-watcher", daemon=True)
        self._thread.start()

    def stop(self):
        """Stop watching for new versions."""
        self._stop.set()

    def _watch(self):
        while not self._stop.wait(self.poll_seconds):
            self.refresh()

    def get(self, name, version=None):
        """The servable for `name` and optional `version` string, or a 404 `RestError`."""
        if name != self.name:
            raise RestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: Latest({name})")
        with self._lock:
            current = self._current
        if current is None:
            raise RestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: Latest({name})")
        if version is not None and version != str(current.version):
            raise RestError(
                HTTPStatus.NOT_FOUND,
                f"Servable not found for request: Specific({name}, {version})",
            )
        return current


def _as_input_array(value, spec, input_name):
    """`value` (nested JSON lists) as an array matching `spec`, or a 400 `RestError`."""
    try:
        array = np.array(value)
    except ValueError as error:  # ragged nesting
        raise RestError(
            HTTPStatus.BAD_REQUEST, f"Input '{input_name}' is not a rectangular array: {error}"
        ) from None
    if array.dtype.kind not in "iuf":
        raise RestError(
            HTTPStatus.BAD_REQUEST,
            f"Input '{input_name}' expects numbers of type {spec.dtype.name}, got JSON "
            f"values of type {array.dtype.name if array.dtype.kind != 'O' else 'mixed'}",
        )
    if array.ndim >= 1 and array.shape[0] == 0:
        raise RestError(HTTPStatus.BAD_REQUEST, f"Input '{input_name}' has an empty batch")
    expected = spec.shape
    if array.ndim != expected.rank or any(
        want is not None and want != got
        for want, got in zip(expected.as_list(), array.shape, strict=True)
    ):
        raise RestError(
            HTTPStatus.BAD_REQUEST,
            f"Input '{input_name}' expects shape {_shape_text(expected)}, got {list(array.shape)}",
        )
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(_NUMPY_DTYPES.get(spec.dtype, np.float32))
    if cast.dtype.kind == "f" and not np.isfinite(cast).all():
        raise RestError(
            HTTPStatus.BAD_REQUEST,
            f"Input '{input_name}' contains NaN, Infinity or values out of {spec.dtype.name} range",
        )
    return cast


def _shape_text(shape):
    return "[" + ", ".join("-1" if d is None else str(d) for d in shape.as_list()) + "]"


def parse_predict_request(body, servable):
    """Decode a `:predict` body into `(signature_name, {input: array}, row_format)`.

    Args:
        body: The raw request bytes.
        servable: The `Servable` that will answer.

    Returns:
        The signature name, the validated input arrays and whether the request
        used the row (`instances`) format.
    """
    try:
        request = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as error:
        raise RestError(HTTPStatus.BAD_REQUEST, f"JSON Parse error: {error}") from None
    if not isinstance(request, dict):
        raise RestError(HTTPStatus.BAD_REQUEST, "JSON Value is not an object")
    signature_name = request.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature_name, str):
        raise RestError(HTTPStatus.BAD_REQUEST, "'signature_name' must be a string")
    specs = servable.input_specs(signature_name)
    has_rows, has_columns = "instances" in request, "inputs" in request
    if has_rows == has_columns:
        raise RestError(
            HTTPStatus.BAD_REQUEST,
            "Missing 'inputs' or 'instances' key"
            if not has_rows
            else "Request must contain either 'instances' or 'inputs', not both",
        )
    if has_rows:
        columns = _rows_to_columns(request["instances"], specs)
    else:
        columns = request["inputs"]
        # One input may be sent bare or named, as TensorFlow Serving allows.
        if len(specs) == 1 and not (isinstance(columns, dict) and set(columns) == set(specs)):
            columns = {next(iter(specs)): columns}
    if not isinstance(columns, dict) or set(columns) != set(specs):
        raise RestError(
            HTTPStatus.BAD_REQUEST,
            f"Expected inputs {sorted(specs)}, got "
            f"{sorted(columns) if isinstance(columns, dict) else 'a single unnamed tensor'}",
        )
    arrays = {name: _as_input_array(columns[name], specs[name], name) for name in specs}
    if len({a.shape[0] for a in arrays.values()}) > 1:
        raise RestError(HTTPStatus.BAD_REQUEST, "Inputs have different batch sizes")
    return signature_name, arrays, has_rows


def _reject_constant(name):
    raise RestError(HTTPStatus.BAD_REQUEST, f"JSON Parse error: {name} is not a valid JSON number")


def _rows_to_columns(instances, specs):
    """Row format (`[instance, ...]`) to `{input: [value, ...]}`."""
    if not isinstance(instances, list):
        raise RestError(HTTPStatus.BAD_REQUEST, "'instances' must be a JSON list")
    if not instances:
        raise RestError(HTTPStatus.BAD_REQUEST, "'instances' is an empty list (empty batch)")
    names = list(specs)
    if all(isinstance(row, dict) for row in instances):
        if any(set(row) != set(names) for row in instances):
            raise RestError(
                HTTPStatus.BAD_REQUEST, f"Every instance must have exactly the keys {names}"
            )
        return {name: [row[name] for row in instances] for name in names}
    if len(names) != 1 or any(isinstance(row, dict) for row in instances):
        raise RestError(
            HTTPStatus.BAD_REQUEST,
            f"Instances must be objects with keys {names} (or all plain values for one input)",
        )
    return {names[0]: instances}


def predict(servable, signature_name, arrays, row_format):
    """Run a signature and format its outputs as TensorFlow Serving does.

    Returns:
        `{"predictions": [...]}` for the row format (one object per instance
        when the signature has several outputs) or `{"outputs": ...}` for the
        columnar format (an object of named outputs when there are several).
    """
    function = servable.signatures[signature_name]
    try:
        outputs = function(**{k: tf.constant(v) for k, v in arrays.items()})
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
        raise RestError(HTTPStatus.BAD_REQUEST, str(error).splitlines()[0]) from None
    outputs = {name: tensor.numpy() for name, tensor in outputs.items()}
    single = next(iter(outputs.values())) if len(outputs) == 1 else None
    if not row_format:
        if single is not None:
            return {"outputs": single.tolist()}
        return {"outputs": {name: value.tolist() for name, value in sorted(outputs.items())}}
    if single is not None:
        return {"predictions": single.tolist()}
    batch = next(iter(outputs.values())).shape[0]
    columns = {name: value.tolist() for name, value in sorted(outputs.items())}
    return {"predictions": [{name: col[i] for name, col in columns.items()} for i in range(batch)]}


def model_status(servable):
    """The `GET /v1/models/NAME` body for the served version."""
    return {
        "model_version_status": [
            {
                "version": str(servable.version),
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }


def model_metadata(servable, name):
    """The `GET /v1/models/NAME/metadata` body."""
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(servable.version)},
        "metadata": {"signature_def": servable.signature_def},
    }


class RestHandler(BaseHTTPRequestHandler):
    """Routes TensorFlow Serving's REST paths to a `ModelRepository`."""

    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections
    server_version = "keras-antisym-local-serving"

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self._handle("GET")

    def do_POST(self):  # noqa: N802
        self._handle("POST")

    def _method_not_allowed(self):
        self._handle(self.command)

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _method_not_allowed

    def _handle(self, method):
        self._unread = 0
        try:
            status, body = HTTPStatus.OK, self._route(method)
        except RestError as error:
            status, body = error.status, {"error": error.message}
        except Exception as error:  # a real fault: answer 500 and keep serving
            log.exception("Internal error on %s %s", method, self.path)
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"Internal: {error}"}
        self._send(status, body)
        if self._unread:
            self._linger()

    def _linger(self):
        """Reads (and drops) a refused body, bounded in bytes and time, before closing.

        Closing with unread data makes the kernel reset the connection, and a
        client still sending its body never reads the 413 (as HTTP servers'
        "lingering close" avoids).
        """
        remaining = min(self._unread, LINGER_FACTOR * self.server.max_body_bytes)
        deadline = time.monotonic() + LINGER_SECONDS
        try:
            self.wfile.flush()
            while remaining > 0 and time.monotonic() < deadline:
                self.connection.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = self.rfile.read1(min(remaining, 1 << 16))
                if not chunk:
                    break
                remaining -= len(chunk)
        except OSError:
            pass

    def _route(self, method):
        match = _PATH.match(self.path.split("?", 1)[0])
        if match is None or match["verb"] not in (None, ":predict"):
            self._discard_body()
            raise RestError(HTTPStatus.NOT_FOUND, f"Malformed request: {method} {self.path}")
        allowed = "POST" if match["verb"] else "GET"
        if method != allowed:
            self._discard_body()
            raise RestError(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"Method {method} not allowed for {self.path}, use {allowed}",
            )
        repository = self.server.repository
        if match["verb"]:
            body = self._read_body()
            servable = repository.get(match["name"], match["version"])
            return predict(servable, *parse_predict_request(body, servable))
        servable = repository.get(match["name"], match["version"])
        if match["metadata"]:
            return model_metadata(servable, match["name"])
        return model_status(servable)

    def _content_length(self):
        try:
            return int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self.close_connection = True
            raise RestError(HTTPStatus.BAD_REQUEST, "Invalid Content-Length header") from None

    def _read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RestError(HTTPStatus.LENGTH_REQUIRED, "Chunked bodies are not supported")
        length = self._content_length()
        if length > self.server.max_body_bytes:
            self.close_connection = True  # the unread body would corrupt the next request
            self._unread = length  # drained after the answer, so the client can read it
            raise RestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"Request body of {length} bytes exceeds the limit of "
                f"{self.server.max_body_bytes} bytes",
            )
        return self.rfile.read(length) if length > 0 else b""

    def _discard_body(self):
        length = self._content_length()
        if 0 < length <= self.server.max_body_bytes:
            self.rfile.read(length)
        elif length:
            self.close_connection = True

    def _send(self, status, body):
        data = json.dumps(body, allow_nan=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
        log.debug("%s %s", self.address_string(), format % args)


class LocalServingServer(ThreadingHTTPServer):
    """A threading HTTP server holding the repository and the body size cap."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address, repository, max_body_bytes=DEFAULT_MAX_BODY_BYTES):
        super().__init__(address, RestHandler)
        self.repository = repository
        self.max_body_bytes = max_body_bytes


def make_server(
    model_base_path,
    model_name,
    host="127.0.0.1",
    port=8501,
    max_body_bytes=DEFAULT_MAX_BODY_BYTES,
    poll_seconds=1.0,
):
    """Load the newest version and bind a server; call `serve_forever()` on it.

    Args:
        model_base_path: Folder with one all-digit sub-folder per version.
        model_name: The model name in URLs.
        host: Interface to bind; 127.0.0.1 keeps it local.
        port: TCP port, 0 for any free one (see `server.server_address`).
        max_body_bytes: Larger request bodies are answered with 413.
        poll_seconds: Seconds between scans for new versions.

    Returns:
        A `LocalServingServer`; `shutdown()` and `server_close()` stop it.
    """
    for arg, value in (("max_body_bytes", max_body_bytes), ("poll_seconds", poll_seconds)):
        if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
            raise ValueError(
                f"Received an invalid value for argument `{arg}`, expected a positive "
                f"number, got {value!r}"
            )
    repository = ModelRepository(model_base_path, model_name, poll_seconds)
    repository.start()
    server = LocalServingServer((host, port), repository, max_body_bytes)
    return server


def main(argv=None):
    """CLI entry point; serves until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m serving.server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-base-path", required=True, help="e.g. models/antisym")
    parser.add_argument("--model-name", required=True, help="name in /v1/models/NAME")
    parser.add_argument("--port", type=int, default=8501, help="REST port (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument(
        "--poll-seconds", type=float, default=1.0, help="seconds between scans for new versions"
    )
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    if not os.path.isdir(args.model_base_path):
        parser.error(
            "Received an invalid value for argument `--model-base-path`, expected an "
            f"existing folder, got {args.model_base_path!r}"
        )
    try:
        server = make_server(
            args.model_base_path,
            args.model_name,
            args.host,
            args.port,
            args.max_body_bytes,
            args.poll_seconds,
        )
    except ValueError as error:
        parser.error(str(error))
    host, port = server.server_address[:2]
    # One parseable line: tests and scripts started with --port 0 read the port from it.
    print(f"Serving {args.model_name} on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.repository.stop()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
