"""TensorFlow Serving's REST API as a WSGI app over a `ModelRepository` (or `Models`).

`/v1/models/NAME`, `/v1/models/NAME/versions/V` and `/v1/models/NAME/labels/LABEL`
each take `/metadata` or `:predict` (a label names a version: `serving.local.model_config`).

Every answer the app gives is JSON: 200 with TensorFlow Serving's layouts,
`{"error": ...}` with 400 (bad input), 404 (unknown model, version or path),
405 (wrong method on a known path), 503 (too many requests waiting for a
worker) and 500 only for real faults. Bodies are strict JSON: never NaN or
Infinity (a prediction that holds them is a 400 naming the output).

`GET /monitoring/prometheus/metrics` answers TensorFlow Serving's request count
and latency metrics (`serving.local.metrics`) in Prometheus' text format.

Every `:predict` and `/metadata` answer carries the version that answered in
the `X-Model-Version` header (TensorFlow Serving's gRPC answers carry it as
`model_spec.version`): a client that streams state through several requests
sees when a new version took over, or pins one with `/versions/N`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from serving.local.metrics import CONTENT_TYPE, METRICS_PATH
from serving.local.payload import (
    RequestError,
    as_input_array,
    model_metadata,
    parse_predict_request,
    predict_body,
)
from serving.local.plane import DataPlane

log = logging.getLogger(__name__)

_PATH = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>[0-9]+)|/labels/(?P<label>[^/:]+))?"
    r"(?:(?P<metadata>/metadata)|(?P<verb>:[A-Za-z]+))?/?$"
)
#: The response header that names the version that answered.
VERSION_HEADER = "X-Model-Version"


def json_response(
    start_response: Callable,
    status: int,
    body: Any,
    extra_headers: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    """Start a JSON response and return its body chunks.

    The body is strict JSON (RFC 8259): one holding NaN or Infinity, which
    `predict` refuses before it gets here, is answered as a 500.
    """
    try:
        data = json.dumps(body, allow_nan=False).encode()
    except ValueError:
        log.error("An answer with status %s held NaN or Infinity; answered 500", status)
        status, extra_headers = HTTPStatus.INTERNAL_SERVER_ERROR, ()
        data = json.dumps({"error": "Internal: the answer holds NaN or Infinity"}).encode()
    status = HTTPStatus(status)
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    start_response(f"{status.value} {status.phrase}", headers + list(extra_headers))
    return [data]


class RestApp:
    """The WSGI app: routes `/v1/models/...` to a `DataPlane`.

    Args:
        plane: The `DataPlane` that answers (its repository, limits and metrics).
        overloaded: Returns True when predictions should be refused with 503.
    """

    def __init__(self, plane: DataPlane, overloaded: Callable[[], bool] | None = None):
        self.plane = plane
        self.overloaded = overloaded or (lambda: False)

    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        # WSGI gives the percent-decoded path as latin-1; model names are UTF-8.
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
        if path == METRICS_PATH and method in ("GET", "HEAD"):
            data = self.plane.metrics.exposition()
            start_response("200 OK", [("Content-Type", CONTENT_TYPE),
                                      ("Content-Length", str(len(data)))])  # fmt: skip
            return [] if method == "HEAD" else [data]
        started = self.plane.clock()
        model = _PATH.match(path)  # also what the metrics count the request under
        extra: list[tuple[str, str]] = []
        status: HTTPStatus
        try:
            status, (body, version) = HTTPStatus.OK, self._route(method, path, model, environ)
            if version is not None:
                extra = [(VERSION_HEADER, str(version))]
        except RequestError as error:
            status, body = HTTPStatus(error.status), {"error": error.message}
            if status == HTTPStatus.SERVICE_UNAVAILABLE:
                extra = [("Retry-After", "1")]
        except Exception as error:  # a real fault: answer 500 and keep serving
            log.exception("Internal error on %s %s", method, path)
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"Internal: {error}"}
        log.debug("%s %s -> %d", method, path[:200], status)
        if model is not None:
            api = "predict" if model["verb"] else "GetModelMetadata" if model["metadata"] else (
                "GetModelStatus"
            )  # fmt: skip
            self.plane.record(model["name"], api, status, started)
        chunks = json_response(start_response, status, body, extra)
        return [] if method == "HEAD" else chunks  # a HEAD answer has headers only

    def _route(
        self, method: str, path: str, match: re.Match | None, environ: dict
    ) -> tuple[Any, int | None]:
        """`(body, the version that answered or None)` of a request, or a `RequestError`."""
        if match is None or match["verb"] not in (None, ":predict"):
            raise RequestError(HTTPStatus.NOT_FOUND, f"Malformed request: {method} {path[:200]}")
        allowed = "POST" if match["verb"] else "GET"
        if method != allowed:
            raise RequestError(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"Method {method} not allowed for {path[:200]}, use {allowed}",
            )
        name, version, label = match["name"], match["version"], match["label"]
        if not match["verb"] and not match["metadata"]:  # every version folder, loaded or not
            return self.plane.status(name, version, label), None
        servable = self.plane.servable(name, version, label)
        if not match["verb"]:
            return model_metadata(servable, name), servable.version
        if self.overloaded():
            raise RequestError(
                HTTPStatus.SERVICE_UNAVAILABLE, "Server overloaded: too many queued requests"
            )
        # The server has read and size-checked the whole body already.
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        signature_name, columns, row_format = parse_predict_request(
            body, servable, self.plane.max_input_elements
        )
        arrays = self.plane.inputs(servable, signature_name, columns, as_input_array)
        outputs = self.plane.run(servable, signature_name, arrays)
        return predict_body(outputs, signature_name, row_format), servable.version
