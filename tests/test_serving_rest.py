"""REST contract of `serving.server` (always) and TensorFlow Serving (with TF_SERVING_URL).

The same tests run against both: status and metadata layouts, row and columnar
predictions, and bad requests answered with TensorFlow Serving's status codes
and `{"error": ...}` bodies, the server still answering afterwards. Set
`TF_SERVING_URL=http://127.0.0.1:8501` (and `TF_SERVING_MODEL`, default
`antisym`) to run them against a real TensorFlow Serving too, and
`TF_SERVING_GRPC=127.0.0.1:8500` for the same contract over gRPC: the same status,
metadata and predictions as over REST, and bad requests refused with gRPC's codes.
"""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from serving.client import GrpcClient, ServingClient, ServingError
from serving.exports.export import export_model
from tests.limits import limit
from tests.serving_helpers import (
    MODEL_KINDS,
    REPO_ROOT,
    SMUGGLED,
    ServerProcess,
    ThreadServer,
    digits,
    exported,
    http_call,
    raw_bad_requests,
    raw_http,
    work_dir,
)

pytestmark = pytest.mark.timeout(300)  # every test stops by itself; this bounds a bug

LOCAL_MAX_BODY_BYTES = 1 << 20
LOCAL_MAX_INPUT_ELEMENTS = 1 << 16  # 1,024 instances of 64 x 1
LOCAL_ONLY = "extension of the local server; TensorFlow Serving answers this differently"


class Target:
    """A REST endpoint under test, with a valid input shape read from its metadata."""

    def __init__(self, url, model, local, grpc=None):
        self.url, self.model, self.local = url.rstrip("/"), model, local
        self.grpc = grpc  # HOST:PORT of its gRPC API, or None
        status, metadata = http_call(f"{self.model_url}/metadata")
        assert status == 200, metadata
        signature = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
        (self.input_name,) = signature["inputs"]
        dims = signature["inputs"][self.input_name]["tensor_shape"]["dim"]
        self.instance_shape = [int(d["size"]) for d in dims[1:]]

    @property
    def model_url(self):
        return f"{self.url}/v1/models/{self.model}"

    def batch(self, n, seed=0):
        return np.random.default_rng(seed).random([n, *self.instance_shape]).astype("float32")

    def assert_still_serving(self):
        status, body = http_call(
            f"{self.model_url}:predict", "POST", {"instances": self.batch(1).tolist()}
        )
        assert status == 200, body


@pytest.fixture(scope="module", params=["local", "tfserving"])
def target(request):
    if request.param == "tfserving":
        url = os.environ.get("TF_SERVING_URL")
        if not url:
            pytest.skip("TF_SERVING_URL is not set: no TensorFlow Serving to test against")
        model = os.environ.get("TF_SERVING_MODEL", "antisym")
        yield Target(url, model, local=False, grpc=os.environ.get("TF_SERVING_GRPC"))
        return
    _, base = exported("antisymmetric")
    server = ServerProcess(
        base, "antisym", block_keras=True,
        extra_args=["--max-body-bytes", str(LOCAL_MAX_BODY_BYTES),
                    "--max-input-elements", str(LOCAL_MAX_INPUT_ELEMENTS)],
    )  # fmt: skip
    try:
        yield Target(server.url, "antisym", local=True, grpc=server.grpc_target)
    finally:
        server.stop()


@pytest.fixture
def grpc_client(target):
    if target.grpc is None:
        pytest.skip("no gRPC endpoint given for this server (TF_SERVING_GRPC)")
    with GrpcClient(target.grpc, target.model, timeout=limit(60), retries=0) as client:
        yield client


def test_grpc_answers_the_status_metadata_and_predictions_rest_answers(target, grpc_client):
    assert grpc_client.status() == http_call(target.model_url)[1]
    assert grpc_client.metadata() == http_call(f"{target.model_url}/metadata")[1]
    x = target.batch(3)
    status, rest = http_call(f"{target.model_url}:predict", "POST", {"inputs": x.tolist()})
    assert status == 200, rest
    answer = grpc_client.predict({target.input_name: x})
    assert answer["model_spec"]["signature_name"] == "serving_default"
    assert sorted(answer["outputs"]) == sorted(rest["outputs"])
    for name, value in answer["outputs"].items():
        np.testing.assert_allclose(value, rest["outputs"][name], rtol=1e-6, err_msg=name)
    version = int(answer["model_spec"]["version"])
    pinned = grpc_client.predict({target.input_name: x}, version=version)
    np.testing.assert_array_equal(pinned["outputs"]["class_id"], answer["outputs"]["class_id"])


def _bad_grpc_calls(target):
    """`(case, inputs, signature, codes)`: calls TensorFlow Serving refuses over gRPC."""
    good = target.batch(2)
    name = target.input_name
    return [
        ("wrong rank", {name: good[0]}, None, {"INVALID_ARGUMENT"}),
        ("wrong length", {name: np.concatenate([good, good[:, :1]], axis=1)}, None,
         {"INVALID_ARGUMENT"}),
        ("wrong dtype", {name: good.astype("float64")}, None, {"INVALID_ARGUMENT"}),
        ("unknown input name", {"pixels": good}, None, {"INVALID_ARGUMENT"}),
        ("missing input", {}, None, {"INVALID_ARGUMENT"}),
        ("unknown signature", {name: good}, "nope", {"FAILED_PRECONDITION", "INVALID_ARGUMENT"}),
    ]  # fmt: skip


def test_bad_grpc_calls_get_their_codes_and_keep_serving(target, grpc_client):
    for case, inputs, signature, codes in _bad_grpc_calls(target):
        with pytest.raises(ServingError) as refused:
            grpc_client.predict(inputs, signature_name=signature)
        assert refused.value.code in codes, (case, refused.value)
        assert refused.value.message.strip(), case
    for url in ("no_such_model", f"{target.model}/versions/987654"):
        model, _, version = url.partition("/versions/")
        with GrpcClient(target.grpc, model, timeout=limit(60), retries=0) as other:
            with pytest.raises(ServingError) as refused:
                other.status(version=int(version) if version else None)
        assert refused.value.code == "NOT_FOUND", url
    assert grpc_client.predict({target.input_name: target.batch(1)})["outputs"]


def test_model_status(target):
    status, body = http_call(target.model_url)
    assert status == 200
    (entry,) = body["model_version_status"]
    assert entry["state"] == "AVAILABLE"
    assert entry["version"].isdigit()
    assert entry["status"]["error_code"] == "OK"
    status, again = http_call(f"{target.model_url}/versions/{entry['version']}")
    assert (status, again) == (200, body)


def test_metadata_layout(target):
    status, body = http_call(f"{target.model_url}/metadata")
    assert status == 200
    assert body["model_spec"]["name"] == target.model
    assert body["model_spec"]["version"].isdigit()
    signature = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["method_name"] == "tensorflow/serving/predict"
    assert target.input_name == "sequence"
    sequence = signature["inputs"]["sequence"]
    assert sequence["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in sequence["tensor_shape"]["dim"]][0] == "-1"
    assert set(signature["outputs"]) >= {"probabilities", "class_id"}
    assert signature["outputs"]["class_id"]["dtype"] == "DT_INT64"


def test_predict_row_and_columnar_formats_agree(target):
    x = target.batch(3)
    status, rows = http_call(f"{target.model_url}:predict", "POST", {"instances": x.tolist()})
    assert status == 200, rows
    assert len(rows["predictions"]) == 3
    assert set(rows["predictions"][0]) >= {"probabilities", "class_id"}
    status, columns = http_call(f"{target.model_url}:predict", "POST", {"inputs": x.tolist()})
    assert status == 200, columns
    assert set(columns["outputs"]) >= {"probabilities", "class_id"}
    np.testing.assert_allclose(
        columns["outputs"]["probabilities"],
        [row["probabilities"] for row in rows["predictions"]],
        rtol=1e-6,
    )
    assert columns["outputs"]["class_id"] == [row["class_id"] for row in rows["predictions"]]
    np.testing.assert_allclose(np.sum(columns["outputs"]["probabilities"], -1), 1, rtol=1e-5)
    # Named instances, named columns, explicit signature and version give the same answer.
    version = http_call(target.model_url)[1]["model_version_status"][0]["version"]
    for body in (
        {"instances": [{"sequence": row} for row in x.tolist()]},
        {"inputs": {"sequence": x.tolist()}, "signature_name": "serving_default"},
    ):
        url = f"{target.model_url}/versions/{version}:predict"
        status, answer = http_call(url, "POST", body)
        assert status == 200, answer
        got = answer.get("outputs", {}).get("class_id") or [
            p["class_id"] for p in answer["predictions"]
        ]
        assert got == columns["outputs"]["class_id"]


def _bad_requests(target):
    """`(case, body, status)`: bodies TensorFlow Serving answers with 400 or 404."""
    good = target.batch(2).tolist()
    longer = target.batch(2, seed=1).tolist()
    longer = [row + row[:1] for row in longer]  # one time step too many
    strings = [[["a"] * len(step) for step in row] for row in good]
    return [
        ("malformed JSON", '{"instances": [1, ', 400),
        ("not an object", "[1, 2]", 400),
        ("neither instances nor inputs", {"data": good}, 400),
        ("both instances and inputs", {"instances": good, "inputs": good}, 400),
        ("instances of wrong rank", {"instances": good[0]}, 400),
        ("inputs of wrong rank", {"inputs": good[0][0]}, 400),
        ("instances of wrong length", {"instances": longer}, 400),
        ("inputs of wrong length", {"inputs": longer}, 400),
        ("instances of wrong dtype", {"instances": strings}, 400),
        ("inputs of wrong dtype", {"inputs": strings}, 400),
        ("ragged instances", {"instances": [good[0], good[1][:-1]]}, 400),
        ("empty instances", {"instances": []}, 400),
        ("empty inputs", {"inputs": []}, 400),
        ("unknown input name", {"instances": [{"pixels": row} for row in good]}, 400),
        ("unknown signature", {"instances": good, "signature_name": "nope"}, 400),
    ]


def test_bad_requests_answer_400_and_keep_serving(target):
    for case, body, expected in _bad_requests(target):
        status, answer = http_call(f"{target.model_url}:predict", "POST", body)
        assert status == expected, (case, status, answer)
        assert isinstance(answer, dict) and isinstance(answer.get("error"), str), (case, answer)
        assert answer["error"].strip(), case
    target.assert_still_serving()


def test_non_finite_values_answer_400(target):
    if not target.local:
        pytest.skip(LOCAL_ONLY)
    x = target.batch(1).tolist()
    text = json.dumps({"instances": x}).replace(str(x[0][0][0]), "NaN", 1)
    assert "NaN" in text
    for body in (text, text.replace("NaN", "-Infinity"), {"inputs": [[[1e39]] * 64]}):
        status, answer = http_call(f"{target.model_url}:predict", "POST", body)
        assert status == 400, answer
        assert any(word in answer["error"] for word in ("NaN", "Infinity", "range"))
    target.assert_still_serving()


def test_unknown_model_or_version_answers_404(target):
    x = {"instances": target.batch(1).tolist()}
    for url, method, body in [
        (f"{target.url}/v1/models/no_such_model", "GET", None),
        (f"{target.url}/v1/models/no_such_model/metadata", "GET", None),
        (f"{target.url}/v1/models/no_such_model:predict", "POST", x),
        (f"{target.model_url}/versions/999999", "GET", None),
        (f"{target.model_url}/versions/999999/metadata", "GET", None),
        (f"{target.model_url}/versions/999999:predict", "POST", x),
    ]:
        status, answer = http_call(url, method, body)
        assert status == 404, (url, answer)
        assert answer["error"].strip()
    target.assert_still_serving()


def test_wrong_method_answers_405(target):
    if not target.local:
        pytest.skip(LOCAL_ONLY)
    for url, method in [
        (f"{target.model_url}:predict", "GET"),
        (f"{target.model_url}", "POST"),
        (f"{target.model_url}/metadata", "DELETE"),
    ]:
        status, answer = http_call(url, method, "{}" if method == "POST" else None)
        assert status == 405, (url, method, answer)
        assert "not allowed" in answer["error"]
    status, answer = http_call(f"{target.url}/v2/elsewhere")
    assert status == 404 and answer["error"].startswith("Malformed request")
    target.assert_still_serving()


def test_oversized_body_answers_413(target):
    if not target.local:
        pytest.skip(LOCAL_ONLY)
    body = json.dumps({"instances": [[[0.5]] * 64] * (LOCAL_MAX_BODY_BYTES // 200)})
    assert len(body) > LOCAL_MAX_BODY_BYTES
    status, answer = http_call(f"{target.model_url}:predict", "POST", body)
    assert status == 413, answer
    assert "exceeds the limit" in answer["error"]
    target.assert_still_serving()


def test_refused_body_still_lets_the_client_read_the_413(target):
    """A client that goes on sending its body after the 413 reads the answer, not a reset."""
    if not target.local:
        pytest.skip(LOCAL_ONLY)
    import socket

    host, port = re.match(r"http://([^/:]+):(\d+)", target.url).groups()
    length = 3 * LOCAL_MAX_BODY_BYTES
    path = f"/v1/models/{target.model}:predict"
    with socket.create_connection((host, int(port)), timeout=limit(30)) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()
        )
        time.sleep(0.5)  # the server has answered 413 by now
        sock.sendall(b" " * length)  # a reset connection fails here or in recv
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"exceeds the limit" in answer
    target.assert_still_serving()


def test_client_against_server(target):
    client = ServingClient(target.url, target.model, timeout=limit(30))
    assert client.status()["model_version_status"][0]["state"] == "AVAILABLE"
    assert "signature_def" in client.metadata()["metadata"]
    x = target.batch(2)
    rows = client.predict(instances=x)
    columns = client.predict(inputs={"sequence": x})
    assert [p["class_id"] for p in rows["predictions"]] == columns["outputs"]["class_id"]
    with pytest.raises(ServingError) as error:
        client.predict(instances=x[:, :-1])
    assert error.value.status == 400 and error.value.message
    with pytest.raises(ServingError) as error:
        ServingClient(target.url, "no_such_model").status()
    assert error.value.status == 404


def test_client_cli(target):
    instances = work_dir("cli-instances.json")
    with open(instances, "w") as f:
        json.dump(target.batch(2).tolist(), f)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "serving.client", "--url", target.url, *args],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=limit(60),
        )  # fmt: skip

    done = cli("--model", target.model, "predict", "--instances-file", instances)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["predictions"]) == 2
    done = cli("--model", target.model, "predict", "--instances-file", instances, "--columnar")
    assert len(json.loads(done.stdout)["outputs"]["class_id"]) == 2
    done = cli("--model", "no_such_model", "status")
    assert done.returncode == 1 and "HTTP 404" in done.stderr


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_rest_predictions_equal_model_predict(kind):
    model, base = exported(kind)
    x = digits()[0][300:316]
    expected = model.predict(x, verbose=0)
    server = ThreadServer(base, kind)
    try:
        client = ServingClient(server.url, kind)
        rows = client.predict(instances=x)["predictions"]
        columns = client.predict(inputs=x)["outputs"]
    finally:
        server.stop()
    np.testing.assert_allclose([r["logits"] for r in rows], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(columns["logits"], expected, rtol=1e-5, atol=1e-5)
    assert columns["class_id"] == expected.argmax(-1).tolist()
    probabilities = np.exp(expected) / np.exp(expected).sum(-1, keepdims=True)
    np.testing.assert_allclose(columns["probabilities"], probabilities, rtol=1e-5, atol=1e-6)


def test_new_version_is_served_without_restart():
    antisym, first = exported("antisymmetric")
    gated, _ = exported("gated")
    base = work_dir("hot-reload")
    shutil.copytree(first, base)
    x = digits()[0][:4]
    server = ThreadServer(base, "antisym", poll_seconds=0.1)
    try:
        client = ServingClient(server.url, "antisym")
        before = client.predict(inputs=x)["outputs"]["logits"]
        export_model(gated, base, 2)
        _wait_for_version(client, "2")
        after = client.predict(inputs=x)["outputs"]["logits"]
        with pytest.raises(ServingError) as error:
            client.predict(inputs=x, version=1)  # the `latest` policy serves one version
        assert error.value.status == 404
        # A version caught mid-copy (no variables/ yet) fails to load, is retried and served.
        os.makedirs(os.path.join(base, "3"))
        shutil.copy(os.path.join(base, "2", "saved_model.pb"), os.path.join(base, "3"))
        time.sleep(0.5)
        assert _served_version(client) == "2"
        shutil.copytree(os.path.join(base, "2", "variables"), os.path.join(base, "3", "variables"))
        _wait_for_version(client, "3")
        # Deleting the newest version rolls back to the next one, served by number too.
        shutil.rmtree(os.path.join(base, "3"))
        shutil.rmtree(os.path.join(base, "2"))
        _wait_for_version(client, "1")
        rolled_back = client.predict(inputs=x, version=1)["outputs"]["logits"]
    finally:
        server.stop()
    np.testing.assert_allclose(before, antisym.predict(x, verbose=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after, gated.predict(x, verbose=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rolled_back, before, rtol=1e-6, atol=1e-6)


def _served_version(client):
    """The AVAILABLE version: the status lists every version folder, highest first."""
    entries = client.status()["model_version_status"]
    return next((e["version"] for e in entries if e["state"] == "AVAILABLE"), None)


def _wait_for_version(client, version, seconds=30):
    deadline = time.monotonic() + seconds
    while True:
        try:
            if _served_version(client) == version:
                return
        except ServingError:
            pass  # 404 while nothing is loaded
        assert time.monotonic() < deadline, f"version {version} was not served"
        time.sleep(0.1)


LOAD_REQUESTS, LOAD_CLIENTS = 2000, 8


def test_bounded_load(target, capsys):
    """2,000 single-instance predictions from 8 concurrent keep-alive clients: zero errors."""
    import http.client
    import re

    if not target.local:
        pytest.skip("the load test runs against the local server on 127.0.0.1 only")
    host, port = re.match(r"http://([^:/]+):(\d+)", target.url).groups()
    path = f"/v1/models/{target.model}:predict"
    bodies = [json.dumps({"instances": target.batch(1, seed=i).tolist()}) for i in range(16)]
    latencies, errors, lock = [], [], threading.Lock()
    per_client = LOAD_REQUESTS // LOAD_CLIENTS

    def client(index):
        conn = http.client.HTTPConnection(host, int(port), timeout=limit(30))
        mine = []
        try:
            for i in range(per_client):
                start = time.perf_counter()
                conn.request("POST", path, bodies[(index + i) % len(bodies)],
                             {"Content-Type": "application/json"})  # fmt: skip
                response = conn.getresponse()
                data = response.read()
                mine.append(time.perf_counter() - start)
                if response.status != 200 or b"predictions" not in data:
                    with lock:
                        errors.append((response.status, data[:200]))
        except Exception as error:  # counted, not raised: the thread must finish
            with lock:
                errors.append(repr(error))
        finally:
            conn.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(LOAD_CLIENTS)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=limit(300))
    elapsed = time.perf_counter() - start
    assert not errors, errors[:5]
    assert len(latencies) == LOAD_REQUESTS
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    with capsys.disabled():
        print(
            f"\nload test: {LOAD_REQUESTS} requests, {LOAD_CLIENTS} clients, 0 errors, "
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, {LOAD_REQUESTS / elapsed:.0f} requests/s"
        )
    target.assert_still_serving()


def _assert_json_error(response, case, low=400, high=499):
    status, headers, body = response
    assert status is not None and low <= status <= high, (case, status, body[:200])
    assert headers.get("content-type") == "application/json", (case, headers)
    assert json.loads(body)["error"].strip(), case


def test_raw_bad_requests_get_one_json_4xx_and_no_smuggling(target):
    """Broken framing, methods, heads and sizes: one JSON 4xx each, never a second request."""
    if not target.local:
        pytest.skip(LOCAL_ONLY)
    for case, data, closes in raw_bad_requests(target.model, LOCAL_MAX_BODY_BYTES):
        responses, closed = raw_http(target.url, data, idle=0.5)
        assert len(responses) == 1, (case, [r[:2] for r in responses])
        _assert_json_error(responses[0], case)
        assert b"SMUGGLED" not in responses[0][2], case
        assert closed or not closes, f"{case}: the connection stayed open"
    # A body on a GET is read as its body (and ignored), not as the next request.
    get = f"GET /v1/models/{target.model} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    data = get.encode() + b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    responses, _ = raw_http(target.url, data, idle=0.5)
    assert [r[0] for r in responses] == [200]
    # HEAD is not TensorFlow Serving's: 405, headers only (a body would break framing).
    head = f"HEAD /v1/models/{target.model} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    responses, _ = raw_http(target.url, head + head, idle=0.5, head=True)
    assert [(r[0], r[2]) for r in responses] == [(405, b"")] * 2
    target.assert_still_serving()


def _local_bad_bodies(target):
    """`(case, body)`: `:predict` bodies the local server answers with a JSON 400."""
    good = target.batch(2).tolist()
    mixed = json.loads(json.dumps(good))
    mixed[1][5][0] = True  # one boolean among floats
    nulls = json.loads(json.dumps(good))
    nulls[0][0][0] = None
    steps = len(good[0])
    return [
        ("a boolean among floats", {"instances": mixed}),
        ("a boolean among columns", {"inputs": {"sequence": mixed}}),
        ("all booleans", {"instances": [[[True]] * steps]}),
        ("a null", {"instances": nulls}),
        ("an object for a number", {"instances": [[[{}]] * steps]}),
        ("one number too deep", {"instances": [[[[0.5]]] * steps]}),
        ("a number for an instance", {"instances": [0.5, 0.5]}),
        ("a number for inputs", {"inputs": 0.5}),
        ("an empty time step", {"instances": [[[]] * steps]}),
        ("instances as an object", {"instances": {"sequence": good}}),
        ("instances mixing objects and lists", {"instances": [{"sequence": good[0]}, good[1]]}),
        ("an extra input", {"inputs": {"sequence": good, "extra": good}}),
        ("signature_name not a string", {"instances": good, "signature_name": 7}),
        ("1e999 (infinite)", '{"instances": [[' + "[1e999]," * (steps - 1) + "[1]]]}"),
        ("a 5,000-digit integer",
         '{"instances": [[' + "[1]," * (steps - 1) + "[" + "9" * 5000 + "]]]}"),
        ("an integer beyond float32", {"instances": [[[10**40]] * steps]}),
        ("a string for the body", '"instances"'),
        ("invalid UTF-8", b'{"instances": "\xff\xfe"}'),
        ("UTF-16", json.dumps({"instances": good}).encode("utf-16")),
        ("deeply nested", "[" * 100_000 + "]" * 100_000),
        ("too many numbers", {"instances": [[[0]] * steps] * (LOCAL_MAX_INPUT_ELEMENTS // 64 + 1)}),
    ]  # fmt: skip


def test_local_bad_bodies_answer_400(target):
    if not target.local:
        pytest.skip(LOCAL_ONLY)
    for case, body in _local_bad_bodies(target):
        status, answer = http_call(f"{target.model_url}:predict", "POST", body)
        assert status == 400, (case, status, answer)
        assert isinstance(answer, dict) and answer["error"].strip(), (case, answer)
    target.assert_still_serving()


def test_json_response_is_json_with_its_length_and_never_nan():
    """The body's length is the header's; NaN or Infinity (not JSON, though TensorFlow
    Serving's writer emits the bare tokens) turns the answer into a strict-JSON 500."""
    from serving.local.rest import json_response

    started = []
    chunks = json_response(
        lambda status, headers: started.append((status, headers)),
        400,
        {"x": [0.25, 1.5]},
        [("Retry-After", "1")],
    )
    assert chunks == [b'{"x": [0.25, 1.5]}']
    assert started == [
        (
            "400 Bad Request",
            [("Content-Type", "application/json"), ("Content-Length", "18"), ("Retry-After", "1")],
        )
    ]
    started.clear()
    (data,) = json_response(
        lambda status, headers: started.append((status, headers)), 200, {"x": [float("inf")]}
    )
    assert json.loads(data, parse_constant=pytest.fail) == {
        "error": "Internal: the answer holds NaN or Infinity"
    }
    assert started[0][0] == "500 Internal Server Error"
    assert ("Content-Length", str(len(data))) in started[0][1]


class _StatusRepository:
    """A repository whose status answer is given (or raised): RestApp's routing alone."""

    def __init__(self, answer):
        self.answer = answer

    def serves(self, name):
        return True

    def status(self, name, version=None, label=None):
        if isinstance(self.answer, Exception):
            raise self.answer
        return {"name": name, **self.answer}


def _wsgi(app, method, path=None):
    environ = {"REQUEST_METHOD": method}
    if path is not None:
        environ["PATH_INFO"] = path
    started = []
    body = b"".join(app(environ, lambda status, headers: started.append((status, headers))))
    status, headers = started[0]
    return status, dict(headers), json.loads(body) if body else None


def test_rest_app_paths_are_utf8_and_undecodable_bytes_are_replaced():
    """WSGI hands the path over as latin-1 characters, one per byte: a UTF-8 model name
    comes back whole, bytes that are no UTF-8 become U+FFFD instead of a 500."""
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    app = RestApp(DataPlane(_StatusRepository({})))
    status, _, body = _wsgi(app, "GET", "/v1/models/caf\xc3\xa9")
    assert status == "200 OK" and body == {"name": "café"}
    status, _, body = _wsgi(app, "GET", "/v1/models/a\xff")
    assert status == "200 OK" and body == {"name": "a\ufffd"}
    status, _, body = _wsgi(app, "GET")  # no PATH_INFO at all
    assert status == "404 Not Found" and body == {"error": "Malformed request: GET "}


class _EchoingRepository(_StatusRepository):
    """A repository whose status answer says what it was asked: the plane's hand-over."""

    def status(self, name, version=None, label=None):
        return {"name": name, "version": version, "label": label}


def test_rest_app_hands_a_status_requests_version_or_label_to_the_repository():
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    app = RestApp(DataPlane(_EchoingRepository({})))
    asked = {
        "/v1/models/m": {"name": "m", "version": None, "label": None},
        "/v1/models/m/versions/7": {"name": "m", "version": "7", "label": None},
        "/v1/models/m/labels/stable": {"name": "m", "version": None, "label": "stable"},
    }
    for path, expected in asked.items():
        status, _, body = _wsgi(app, "GET", path)
        assert (status, body) == ("200 OK", expected), path


def test_rest_app_times_each_request_on_the_planes_clock():
    """The latency histogram adds the time between the request's start and its answer on
    the plane's clock (a stand-in: 0.25 s, then 1.5 s), in microseconds."""
    from serving.local.metrics import ServingMetrics
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    readings = iter([100.0, 100.25, 200.0, 201.5])
    metrics = ServingMetrics()
    app = RestApp(DataPlane(_StatusRepository({}), metrics=metrics, clock=lambda: next(readings)))
    for _ in range(2):
        assert _wsgi(app, "GET", "/v1/models/m")[0] == "200 OK"
    page = metrics.exposition().decode()
    labels = '{model_name="m",API="GetModelStatus",entrypoint="REST"}'
    assert f":tensorflow:serving:request_latency_sum{labels} 1750000.0" in page, page
    assert f":tensorflow:serving:request_latency_count{labels} 2" in page, page


def test_rest_app_answers_the_metrics_page_with_its_length_and_head_without_it():
    from serving.local.metrics import CONTENT_TYPE, METRICS_PATH, ServingMetrics
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    metrics = ServingMetrics()
    metrics.record("m", "predict", 200, 0.001)
    app = RestApp(DataPlane(_StatusRepository({}), metrics=metrics))
    started = []
    for method in ("GET", "HEAD"):
        chunks = app({"REQUEST_METHOD": method, "PATH_INFO": METRICS_PATH},
                     lambda status, headers: started.append((status, headers)))  # fmt: skip
        page = metrics.exposition()
        assert started.pop() == ("200 OK", [("Content-Type", CONTENT_TYPE),
                                           ("Content-Length", str(len(page)))])  # fmt: skip
        assert b"".join(chunks) == (page if method == "GET" else b"")


def test_rest_app_says_when_to_retry_only_when_overloaded():
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    app = RestApp(DataPlane(_StatusRepository({})), overloaded=lambda: True)
    # Overload refuses predictions only; other answers carry no Retry-After.
    status, headers, _ = _wsgi(app, "GET", "/v1/models/m:predict")
    assert status == "405 Method Not Allowed" and "Retry-After" not in headers
    app.plane.repository.get = lambda name, version=None, label=None: object()
    status, headers, body = _wsgi(app, "POST", "/v1/models/m:predict")
    assert status == "503 Service Unavailable" and headers["Retry-After"] == "1"
    assert body == {"error": "Server overloaded: too many queued requests"}


def test_rest_app_logs_a_fault_with_its_request_and_answers_500(caplog):
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    app = RestApp(DataPlane(_StatusRepository(RuntimeError("boom"))))
    with caplog.at_level(logging.ERROR, logger="serving"):
        status, _, body = _wsgi(app, "GET", "/v1/models/m")
    assert status == "500 Internal Server Error" and body == {"error": "Internal: boom"}
    (record,) = caplog.records
    assert record.getMessage() == "Internal error on GET /v1/models/m"
    assert record.exc_info[1].args == ("boom",)


def test_rest_app_refusals_name_the_request_up_to_200_characters(caplog):
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    app = RestApp(DataPlane(_StatusRepository({})))
    long = "/v2/" + "x" * 300
    assert _wsgi(app, "GET", long)[::2] == (
        "404 Not Found",
        {"error": f"Malformed request: GET {long[:200]}"},
    )
    assert _wsgi(app, "GET", "/v1/models/m:classify")[::2] == (
        "404 Not Found",
        {"error": "Malformed request: GET /v1/models/m:classify"},
    )
    long_name = "/v1/models/" + "m" * 300
    assert _wsgi(app, "POST", long_name)[::2] == (
        "405 Method Not Allowed",
        {"error": f"Method POST not allowed for {long_name[:200]}, use GET"},
    )
    with caplog.at_level(logging.DEBUG, logger="serving"):
        _wsgi(app, "GET", long_name)
    assert [r.getMessage() for r in caplog.records] == [f"GET {long_name[:200]} -> 200"]


def test_rest_app_answers_head_with_the_headers_of_get_and_no_body():
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    app = RestApp(DataPlane(_StatusRepository({"versions": 1})))
    assert _wsgi(app, "GET", "/v1/models/m")[2] == {"name": "m", "versions": 1}
    # HEAD on a GET path is refused with 405 (as TensorFlow Serving), without a body.
    started = []
    chunks = app({"REQUEST_METHOD": "HEAD", "PATH_INFO": "/v1/models/m"},
                 lambda status, headers: started.append((status, dict(headers))))  # fmt: skip
    assert chunks == []
    status, headers = started[0]
    assert status == "405 Method Not Allowed" and int(headers["Content-Length"]) > 0


def test_rest_app_without_an_overload_test_never_refuses():
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    assert RestApp(DataPlane(_StatusRepository({}))).overloaded() is False


class _Servable:
    """What RestApp reads of a loaded version before the prediction itself."""

    max_rank, version = 3, 7
    signature_def = {"serving_default": {"method_name": "tensorflow/serving/predict"}}

    def input_specs(self, signature_name):
        from serving.local.payload import RequestError

        raise RequestError(400, f"reached the signature {signature_name!r}")


def _post(app, body, content_length=None, trailing=b""):
    import io

    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/models/m:predict",
               "wsgi.input": io.BytesIO(body + trailing)}  # fmt: skip
    if content_length is not None:
        environ["CONTENT_LENGTH"] = str(content_length)
    started = []
    answer = b"".join(app(environ, lambda status, headers: started.append(status)))
    return started[0], json.loads(answer)


def _servable_app(**kwargs):
    from serving.local.plane import DataPlane
    from serving.local.rest import RestApp

    repository = _StatusRepository({})
    repository.get = lambda name, version=None, label=None: _Servable()
    return RestApp(DataPlane(repository, **kwargs))


def test_rest_app_reads_the_body_up_to_its_content_length_only():
    """PEP 3333: the input stream need not end at CONTENT_LENGTH (what follows is not
    this request's)."""
    body = b'{"signature_name": "s", "instances": [1]}'
    status, answer = _post(_servable_app(), body, len(body), trailing=b"GET / HTTP/1.1")
    assert (status, answer) == ("400 Bad Request", {"error": "reached the signature 's'"})


def test_rest_app_bounds_the_body_by_its_max_input_elements():
    body = b"[" + b"0," * 2000 + b"0]"
    status, answer = _post(_servable_app(max_input_elements=10), body, len(body))
    assert status == "400 Bad Request"
    assert answer == {"error": "Request body has about 2001 JSON values, more than inputs of "
                               "at most 10 numbers need (--max-input-elements)"}  # fmt: skip
    status, answer = _post(_servable_app(), body, len(body))  # the default bound admits it
    assert status == "400 Bad Request" and answer == {"error": "JSON Value is not an object"}


def test_rest_app_metadata_names_the_model_and_its_version():
    status, _, body = _wsgi(_servable_app(), "GET", "/v1/models/m/versions/7/metadata")
    assert status == "200 OK"
    assert body == {"model_spec": {"name": "m", "signature_name": "", "version": "7"},
                    "metadata": {"signature_def": _Servable.signature_def}}  # fmt: skip
