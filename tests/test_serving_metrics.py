"""`GET /monitoring/prometheus/metrics`: TensorFlow Serving's request count and latency
metrics, read back with Prometheus' own parser, against the requests that were sent."""

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving import codes
from serving.local import metrics as serving_metrics
from tests.limits import limit
from tests.serving_helpers import ThreadServer, exported, http_call

PREDICT = {"instances": [[[0.5]] * 64] * 2}


def _families(text):
    return {family.name: family for family in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def server():
    _, base = exported("antisymmetric")
    served = ThreadServer(base, "antisym")
    yield served
    served.stop()


def test_every_request_to_a_model_is_counted_by_status_and_timed_by_api(server):
    url = server.url
    before = _families(http_call(url + serving_metrics.METRICS_PATH)[1])
    assert before.keys() == {":tensorflow:serving:request_count",
                             ":tensorflow:serving:request_latency"}  # fmt: skip
    sent = [
        ("POST", "/v1/models/antisym:predict", PREDICT, 200),
        ("POST", "/v1/models/antisym:predict", PREDICT, 200),
        ("POST", "/v1/models/antisym:predict", {"instances": "no"}, 400),
        ("GET", "/v1/models/antisym/metadata", None, 200),
        ("GET", "/v1/models/antisym", None, 200),
        ("GET", "/v1/models/other", None, 404),
        ("GET", "/v1/models/antisym:predict", None, 405),
        ("GET", "/v1/nothing", None, 404),  # names no model: not counted
    ]
    for method, path, body, status in sent:
        assert http_call(url + path, method, body)[0] == status, path
    status, text = http_call(url + serving_metrics.METRICS_PATH)
    assert status == 200
    families = _families(text)

    counts = {
        (s.labels["model_name"], s.labels["status"]): s.value
        for s in families[":tensorflow:serving:request_count"].samples
    }
    assert counts == {
        ("antisym", "OK"): 4, ("antisym", "INVALID_ARGUMENT"): 1,
        ("antisym", "UNIMPLEMENTED"): 1, ("(unknown)", "NOT_FOUND"): 1,
    }  # fmt: skip
    latency = families[":tensorflow:serving:request_latency"].samples
    totals = {
        (s.labels["model_name"], s.labels["API"], s.labels["entrypoint"]): s.value
        for s in latency if s.name.endswith("_count")
    }  # fmt: skip
    assert totals == {
        ("antisym", "predict", "REST"): 4, ("antisym", "GetModelMetadata", "REST"): 1,
        ("antisym", "GetModelStatus", "REST"): 1, ("(unknown)", "GetModelStatus", "REST"): 1,
    }  # fmt: skip
    # The buckets are TensorFlow Serving's: 10 µs times powers of 1.8, cumulative, +Inf last.
    predict = [s for s in latency if s.name.endswith("_bucket")
               and s.labels["API"] == "predict"]  # fmt: skip
    bounds = [float(s.labels["le"]) for s in predict]
    assert len(bounds) == 33 and bounds[-1] == math.inf
    assert bounds[:3] == [10.0, 18.0, pytest.approx(32.4)]
    assert all(b == pytest.approx(10 * 1.8**i, rel=1e-5) for i, b in enumerate(bounds[:-1]))
    values = [s.value for s in predict]
    assert values == sorted(values) and values[-1] == 4
    total = next(s.value for s in latency if s.name.endswith("_sum")
                 and s.labels["API"] == "predict")  # fmt: skip
    assert total > 0  # microseconds of four predictions


def test_the_metrics_answer_in_prometheus_text_format_and_count_nothing_themselves(server):
    import http.client

    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=limit(30))
    for _ in range(2):
        connection.request("GET", serving_metrics.METRICS_PATH)
        answer = connection.getresponse()
        body = answer.read().decode()
        assert answer.status == 200
        assert answer.getheader("Content-Type") == serving_metrics.CONTENT_TYPE
    connection.close()
    assert "# TYPE :tensorflow:serving:request_count counter" in body
    assert "# TYPE :tensorflow:serving:request_latency histogram" in body
    assert "monitoring" not in body  # the metrics path names no model


@pytest.mark.parametrize(
    "status, name",
    [(200, "OK"), (400, "INVALID_ARGUMENT"), (404, "NOT_FOUND"), (405, "UNIMPLEMENTED"),
     (413, "RESOURCE_EXHAUSTED"), (500, "INTERNAL"), (503, "UNAVAILABLE"), (418, "UNKNOWN")],
)  # fmt: skip
def test_http_statuses_are_counted_under_tensorflow_serving_s_status_names(status, name):
    assert codes.status_name(status) == name


def test_a_latency_falls_in_the_first_bucket_whose_bound_holds_it():
    metrics = serving_metrics.ServingMetrics()
    for seconds in (0.0, 10e-6, 10.5e-6, 1e6):  # on the first bound, just past it, beyond all
        metrics.record("m", "predict", 200, seconds)
    (histogram,) = [f for f in _families(metrics.exposition().decode()).values()
                    if f.name == serving_metrics.REQUEST_LATENCY]  # fmt: skip
    buckets = [s.value for s in histogram.samples if s.name.endswith("_bucket")]
    assert buckets[:2] == [2, 3] and buckets[-2] == 3 and buckets[-1] == 4
    (total,) = [s.value for s in histogram.samples if s.name.endswith("_sum")]
    assert total == pytest.approx(10 + 10.5 + 1e12)


def test_the_text_is_written_as_tensorflow_serving_writes_it():
    """The lines as TensorFlow Serving's own page spells them (a parser would also read
    `+inf` or a `_total` suffix; a dashboard's exact queries would not)."""
    metrics = serving_metrics.ServingMetrics()
    # 2⁻²⁰ s = 10⁶/2²⁰ µs = 0.95367431640625 µs exactly: the first bucket, and the sum.
    metrics.record("m", "predict", 200, 2**-20, entrypoint="GRPC")
    lines = metrics.exposition().decode().splitlines()
    labels = 'model_name="m",API="predict",entrypoint="GRPC"'
    bucket = f"{serving_metrics.REQUEST_LATENCY}_bucket"
    buckets = [line for line in lines if line.startswith(bucket)]
    assert buckets[0] == f'{bucket}{{{labels},le="10"}} 1'
    assert buckets[1] == f'{bucket}{{{labels},le="18"}} 1'
    assert buckets[-1] == f'{bucket}{{{labels},le="+Inf"}} 1'
    assert len(buckets) == 33
    assert f'{serving_metrics.REQUEST_COUNT}{{model_name="m",status="OK"}} 1' in lines
    assert f"{serving_metrics.REQUEST_LATENCY}_count{{{labels}}} 1" in lines
    assert f"{serving_metrics.REQUEST_LATENCY}_sum{{{labels}}} 0.95367431640625" in lines
    assert lines[-1] == f"{serving_metrics.REQUEST_LATENCY}_count{{{labels}}} 1"
    # A request of no named entrypoint came over REST.
    metrics.record("m", "GetModelStatus", 200, 4e-6)
    rest = 'model_name="m",API="GetModelStatus",entrypoint="REST"'
    assert f"{serving_metrics.REQUEST_LATENCY}_count{{{rest}}} 1" in metrics.exposition().decode()


@pytest.mark.parametrize(
    "name",
    # A backslash before `n` or before the closing quote reads as an escape unless escaped.
    ['a "quoted" \\ name', "a\\nb", "ends in \\", "two\nlines"],
)
def test_label_values_are_escaped_as_prometheus_reads_them(name):
    metrics = serving_metrics.ServingMetrics()
    metrics.record(name, "predict", 400, 0.001)
    families = _families(metrics.exposition().decode())
    (sample,) = families[serving_metrics.REQUEST_COUNT].samples
    assert sample.labels == {"model_name": name, "status": "INVALID_ARGUMENT"}


def test_names_of_models_not_served_are_one_series_and_served_names_are_capped():
    """However many names unauthenticated clients make up, the page keeps one series for
    them; a served model keeps its own name, cut to the cap."""
    kept = serving_metrics.ServingMetrics()
    for index in range(2000):
        kept.record(f"made-up-{index}" * 50, "GetModelStatus", 404, 1e-4, served=False)
    kept.record("antisym", "predict", 200, 2e-3)
    long_name = "m" * (serving_metrics.MAX_LABEL_CHARS + 1000)
    kept.record(long_name, "predict", 200, 2e-3)
    families = _families(kept.exposition().decode())
    counts = {(s.labels["model_name"], s.labels["status"]): s.value
              for s in families[":tensorflow:serving:request_count"].samples}  # fmt: skip
    capped = long_name[: serving_metrics.MAX_LABEL_CHARS]
    assert counts == {("(unknown)", "NOT_FOUND"): 2000, ("antisym", "OK"): 1, (capped, "OK"): 1}
    assert len(kept.exposition()) < 30_000


def test_requests_to_unknown_models_do_not_grow_the_served_page(server):
    url = server.url
    before = len(http_call(url + serving_metrics.METRICS_PATH)[1])
    for index in range(300):
        assert http_call(f"{url}/v1/models/unknown{index}{'y' * 500}")[0] == 404
    text = http_call(url + serving_metrics.METRICS_PATH)[1]
    assert "yyyy" not in text and len(text) < before + 8_000  # one series at most, not 300
