"""A small client and CLI for TensorFlow Serving's REST API (and `serving.server`).

    python -m serving.client --url http://127.0.0.1:8501 --model antisym status
    python -m serving.client --url http://127.0.0.1:8501 --model antisym metadata
    python -m serving.client --url http://127.0.0.1:8501 --model antisym predict \
        --instances-file batch.json [--columnar] [--version 2]
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from http import HTTPStatus

from serving.messages import invalid

DEFAULT_TIMEOUT_SECONDS = 10.0


class ServingError(Exception):
    """A request the server answered with an error (or that never got an answer).

    Attributes:
        status: The HTTP status code, or `None` when no response arrived.
        message: The server's `{"error": ...}` message, or the transport error.
    """

    def __init__(self, status, message, url):
        super().__init__(f"HTTP {status} from {url}: {message}" if status else f"{url}: {message}")
        self.status = status
        self.message = message
        self.url = url


class ServingClient:
    """Calls one model of a TensorFlow Serving REST endpoint.

    Args:
        url: Base URL, e.g. `http://127.0.0.1:8501`.
        model: The model name.
        timeout: Seconds to wait for each response.
        retries: How many times to retry a 503 (model loading, overloaded).
        backoff: Seconds before the first retry, doubled after each.
    """

    def __init__(self, url, model, timeout=DEFAULT_TIMEOUT_SECONDS, retries=3, backoff=0.2):
        if not isinstance(retries, int) or retries < 0:
            raise invalid("retries", "a non-negative integer", repr(retries))
        if not timeout or timeout <= 0:
            raise invalid("timeout", "a positive number of seconds", repr(timeout))
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    def _model_url(self, version=None):
        path = f"{self.url}/v1/models/{self.model}"
        return path if version is None else f"{path}/versions/{int(version)}"

    def request(self, method, url, body=None):
        """Send one request; return the decoded JSON or raise `ServingError`.

        Args:
            method: `"GET"` or `"POST"`.
            url: The full URL.
            body: A JSON-serialisable object for POST, or raw `bytes`.

        Returns:
            The decoded JSON response.
        """
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
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

    def status(self, version=None):
        """`GET /v1/models/NAME[/versions/V]`: the model version status."""
        return self.request("GET", self._model_url(version))

    def metadata(self, version=None):
        """`GET /v1/models/NAME[/versions/V]/metadata`: the signature definitions."""
        return self.request("GET", self._model_url(version) + "/metadata")

    def predict(self, instances=None, inputs=None, version=None, signature_name=None):
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
            raise ValueError(
                "Received an invalid value for arguments `instances` and `inputs`, expected "
                "exactly one of them, got " + ("both" if instances is not None else "neither")
            )
        body = {"instances": instances} if instances is not None else {"inputs": inputs}
        if signature_name is not None:
            body["signature_name"] = signature_name
        return self.request("POST", self._model_url(version) + ":predict", _tolist(body))


def _tolist(value):
    """Nested NumPy arrays (or anything with `tolist`) as JSON-ready lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _tolist(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tolist(v) for v in value]
    return value


def _error_message(error):
    """The `{"error": ...}` message of an HTTP error response, else its raw text."""
    raw = error.read().decode("utf-8", "replace")
    try:
        return json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return raw or error.reason


def main(argv=None):
    """CLI entry point; prints the JSON response and returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m serving.client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default="http://127.0.0.1:8501")
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", type=int)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("command", choices=["status", "metadata", "predict"])
    parser.add_argument("--instances-file", help="JSON list of instances (predict)")
    parser.add_argument("--columnar", action="store_true", help="send them as `inputs`")
    parser.add_argument("--signature-name")
    args = parser.parse_args(argv)
    try:
        client = ServingClient(args.url, args.model, args.timeout, args.retries)
    except ValueError as error:
        parser.error(str(error))
    try:
        if args.command == "status":
            result = client.status(args.version)
        elif args.command == "metadata":
            result = client.metadata(args.version)
        else:
            if not args.instances_file:
                parser.error(str(invalid("--instances-file", "a JSON file for `predict`", "none")))
            with open(args.instances_file) as f:
                batch = json.load(f)
            key = "inputs" if args.columnar else "instances"
            result = client.predict(
                **{key: batch}, version=args.version, signature_name=args.signature_name
            )
    except ServingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
