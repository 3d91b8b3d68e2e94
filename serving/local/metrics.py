"""TensorFlow Serving's Prometheus metrics, kept by the local server.

The names, labels and buckets are TensorFlow Serving's own (its monitoring
config exports `/tensorflow/serving/...` as `:tensorflow:serving:...`), so a
dashboard built against the local server reads a TensorFlow Serving container
unchanged:

* `:tensorflow:serving:request_count{model_name, status}`: requests that name
  a model, by the canonical status of their answer (`OK`, `INVALID_ARGUMENT`,
  `NOT_FOUND`, `UNAVAILABLE`, ...);
* `:tensorflow:serving:request_latency{model_name, API, entrypoint}`: a
  histogram of their wall time in microseconds, `API` one of `predict`,
  `GetModelMetadata` and `GetModelStatus`, `entrypoint` `REST` or `GRPC`, with TensorFlow
  Serving's buckets (10 µs times powers of 1.8, 33 of them).

A request that names a model the server does not serve is counted under the one
`model_name` `UNKNOWN_MODEL`, and a served name is cut to `MAX_LABEL_CHARS`: the
names a client sends never add series, so unauthenticated traffic cannot grow the
server's memory or its page.

`GET /monitoring/prometheus/metrics` answers them in Prometheus' text format
(`serving.local.rest`), written here as TensorFlow Serving writes it: a counter keeps
its name (Prometheus' client library would add `_total`).
"""

from __future__ import annotations

import threading

from serving.codes import status_name

#: Where TensorFlow Serving's monitoring config exports the metrics.
METRICS_PATH = "/monitoring/prometheus/metrics"
#: The content type of Prometheus' text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

REQUEST_COUNT = ":tensorflow:serving:request_count"
REQUEST_LATENCY = ":tensorflow:serving:request_latency"
#: Upper bounds (microseconds) of the latency buckets: TensorFlow Serving's
#: `Buckets::Exponential(10, 1.8, 33)`; the last bucket holds the rest (+Inf).
#: Six significant digits, as the text format shows them.
LATENCY_BOUNDS_US = tuple(float(f"{10.0 * 1.8**index:.6g}") for index in range(32))
#: The `model_name` of every request to a model that is not served.
UNKNOWN_MODEL = "(unknown)"
#: The longest `model_name` label a served model gets.
MAX_LABEL_CHARS = 256


class ServingMetrics:
    """The request counts and latencies of one server (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        # (model_name, API, entrypoint) -> [count per bucket (the last: +Inf)], sum
        self._latency: dict[tuple[str, str, str], tuple[list[int], list[float]]] = {}

    def record(
        self,
        model_name: str,
        api: str,
        status: int | str,
        seconds: float,
        entrypoint: str = "REST",
        served: bool = True,
    ) -> None:
        """Counts one request to `model_name` answered in `seconds` with `status`: an HTTP
        status (REST) or a canonical code name (gRPC's, `"NOT_FOUND"`); under
        `UNKNOWN_MODEL` when the model is not `served`."""
        model_name = model_name[:MAX_LABEL_CHARS] if served else UNKNOWN_MODEL
        micros = seconds * 1e6
        bucket = next(
            (i for i, bound in enumerate(LATENCY_BOUNDS_US) if micros <= bound),
            len(LATENCY_BOUNDS_US),
        )
        with self._lock:
            key = (model_name, status if isinstance(status, str) else status_name(status))
            self._counts[key] = self._counts.get(key, 0) + 1
            counts, total = self._latency.setdefault(
                (model_name, api, entrypoint), ([0] * (len(LATENCY_BOUNDS_US) + 1), [0.0])
            )
            counts[bucket] += 1
            total[0] += micros

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format (version 0.0.4), as TensorFlow Serving
        writes it: the counter under its own name (no `_total`), the histogram's buckets
        cumulative with `+Inf` last."""
        with self._lock:
            counts = sorted(self._counts.items())
            latency = sorted((key, (list(c), t[0])) for key, (c, t) in self._latency.items())
        lines = [
            f"# HELP {REQUEST_COUNT} The total number of requests.",
            f"# TYPE {REQUEST_COUNT} counter",
        ]
        for (model_name, status), value in counts:
            lines.append(f"{REQUEST_COUNT}{_labels(model_name=model_name, status=status)} {value}")
        lines += [
            f"# HELP {REQUEST_LATENCY} Distribution of wall time (in microseconds) for "
            "Tensorflow Serving request.",
            f"# TYPE {REQUEST_LATENCY} histogram",
        ]
        bounds = [*(f"{bound:.6g}" for bound in LATENCY_BOUNDS_US), "+Inf"]
        for (model_name, api, entrypoint), (per_bucket, total) in latency:
            names = {"model_name": model_name, "API": api, "entrypoint": entrypoint}
            running = 0
            for bound, count in zip(bounds, per_bucket, strict=True):
                running += count
                lines.append(f"{REQUEST_LATENCY}_bucket{_labels(**names, le=bound)} {running}")
            lines.append(f"{REQUEST_LATENCY}_sum{_labels(**names)} {total!r}")
            lines.append(f"{REQUEST_LATENCY}_count{_labels(**names)} {running}")
        return ("\n".join(lines) + "\n").encode()


def _labels(**labels: str) -> str:
    """`{name="value",...}` with Prometheus' escapes (backslash, quote, newline)."""

    def escaped(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{name}="{escaped(value)}"' for name, value in labels.items()) + "}"
