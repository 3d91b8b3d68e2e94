"""`serving.client`: retries on 503, timeouts, errors carrying the server's message."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serving.client import ServingClient, ServingError


class _Scripted(BaseHTTPRequestHandler):
    """Answers each request with the next `(status, body, delay)` of the server's script."""

    protocol_version = "HTTP/1.1"

    def _answer(self):
        length = int(self.headers.get("Content-Length", "0"))
        self.server.bodies.append(self.rfile.read(length) if length else b"")
        self.server.paths.append((self.command, self.path))
        status, body, delay = self.server.script.pop(0)
        time.sleep(delay)
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (timeout test)
            pass

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.daemon_threads = True
    server.script, server.paths, server.bodies = [], [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _client(server, **kwargs):
    return ServingClient(f"http://127.0.0.1:{server.server_address[1]}", "m", **kwargs)


def test_retries_503_then_succeeds(stub):
    ok = {"model_version_status": []}
    stub.script = [(503, {"error": "loading"}, 0), (503, {"error": "loading"}, 0), (200, ok, 0)]
    assert _client(stub, retries=3, backoff=0.01).status() == ok
    assert stub.paths == [("GET", "/v1/models/m")] * 3


def test_gives_up_after_retries_with_the_server_message(stub):
    stub.script = [(503, {"error": "overloaded"}, 0)] * 3
    with pytest.raises(ServingError) as error:
        _client(stub, retries=2, backoff=0.01).status()
    assert (error.value.status, error.value.message) == (503, "overloaded")
    assert len(stub.paths) == 3


def test_client_errors_are_not_retried_and_carry_the_message(stub):
    stub.script = [(400, {"error": "Input 'sequence' expects shape [-1, 64, 1]"}, 0)]
    with pytest.raises(ServingError, match=r"HTTP 400 .*expects shape") as error:
        _client(stub).predict(instances=[[[0.0]]])
    assert error.value.status == 400
    assert len(stub.paths) == 1


def test_request_formats_and_paths(stub):
    stub.script = [(200, {"predictions": []}, 0), (200, {"outputs": []}, 0), (200, {}, 0)]
    client = _client(stub)
    client.predict(instances=[[[1.0]]], signature_name="serving_default")
    client.predict(inputs={"sequence": [[[1.0]]]}, version=3)
    client.metadata(version=3)
    assert stub.paths == [
        ("POST", "/v1/models/m:predict"),
        ("POST", "/v1/models/m/versions/3:predict"),
        ("GET", "/v1/models/m/versions/3/metadata"),
    ]
    assert json.loads(stub.bodies[0]) == {
        "instances": [[[1.0]]],
        "signature_name": "serving_default",
    }
    assert json.loads(stub.bodies[1]) == {"inputs": {"sequence": [[[1.0]]]}}


def test_timeout_raises_serving_error(stub):
    stub.script = [(200, {}, 1.0)]
    start = time.monotonic()
    with pytest.raises(ServingError) as error:
        _client(stub, timeout=0.2, retries=0).status()
    assert error.value.status is None
    assert time.monotonic() - start < 1.0


def test_connection_refused_raises_serving_error():
    with pytest.raises(ServingError) as error:
        ServingClient("http://127.0.0.1:9", "m", timeout=2, retries=0).status()
    assert error.value.status is None


@pytest.mark.parametrize(
    "kwargs, argument",
    [({"retries": -1}, "`retries`"), ({"timeout": 0}, "`timeout`")],
)
def test_invalid_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        ServingClient("http://127.0.0.1:8501", "m", **kwargs)


def test_predict_needs_exactly_one_format():
    client = ServingClient("http://127.0.0.1:8501", "m")
    with pytest.raises(ValueError, match="`instances` and `inputs`"):
        client.predict()
    with pytest.raises(ValueError, match="`instances` and `inputs`"):
        client.predict(instances=[1], inputs=[1])


@pytest.mark.parametrize(
    "args, argument",
    [
        (["predict"], "`--instances-file`"),
        (["predict", "--instances-file", "/no/such/batch.json"], "`--instances-file`"),
        (["--retries", "-1", "status"], "`retries`"),
    ],
)
def test_cli_usage_errors_are_one_line(args, argument, capsys):
    from serving.client import main

    assert main(["--model", "m", *args]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m serving.client: error: ")
    assert argument in lines[0]
