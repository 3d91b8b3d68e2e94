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

from apputil.cli import EXIT_FAILURE, OneLineParser, execute, run
from apputil.errors import Literal, invalid
from serving.client_base import (
    DEFAULT_TIMEOUT_SECONDS,
    NoStreamSignatureError,
    ServingError,
    StreamingClient,
    as_lists,
)
from serving.grpc_client import GrpcClient
from serving.names import (
    STREAM_SIGNATURE,
)

DEFAULT_CHUNK = 28

# The clients' names, one import for users: `from serving.client import GrpcClient`.
__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "GrpcClient",
    "NoStreamSignatureError",
    "ServingClient",
    "ServingError",
    "encode_json",
    "main",
    "stream",
]


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


class ServingClient(StreamingClient):
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
        super().__init__(model, timeout, retries, backoff)
        self.url = _check_url(url).rstrip("/")

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
            result = as_lists(client.predict(inputs, args.version, signature_name))
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


def _stream(client: StreamingClient, args: argparse.Namespace) -> None:
    """Streams `--sequence-file` in `--chunk`-step chunks; one JSON line per answer."""
    if isinstance(args.chunk, bool) or args.chunk < 1:
        raise invalid("--chunk", "a positive number of steps", args.chunk)
    sequence = _read_sequence(args.sequence_file)
    steps = sequence.shape[-2]
    starts = range(0, steps, args.chunk)
    chunks = (sequence[..., start : start + args.chunk, :] for start in starts)
    for start, answer in zip(starts, client.stream(chunks, args.version), strict=False):
        seen = min(start + args.chunk, steps)
        print(json.dumps({"steps": seen, **as_lists(answer)}), flush=True)


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
    execute(main)
