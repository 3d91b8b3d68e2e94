"""`serving.client`: retries on 503, timeouts, errors carrying the server's message."""

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serving.client import GrpcClient, ServingClient, ServingError
from serving.client_base import StreamingClient
from tests.limits import limit
from tests.serving_helpers import REPO_ROOT


class _Scripted(BaseHTTPRequestHandler):
    """Answers each request with the next `(status, body, delay)` of the server's script."""

    protocol_version = "HTTP/1.1"

    def _answer(self):
        length = int(self.headers.get("Content-Length", "0"))
        self.server.bodies.append(self.rfile.read(length) if length else b"")
        self.server.paths.append((self.command, self.path))
        self.server.types.append(self.headers.get("Content-Type"))
        status, body, delay = self.server.script.pop(0)
        time.sleep(delay)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
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
    server.script, server.paths, server.bodies, server.types = [], [], [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=limit(10))


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
    refused = ConnectionRefusedError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
    assert error.value.message == str(refused)  # the reason, not urllib's wrapper


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


def _url(server):
    return f"http://127.0.0.1:{server.server_address[1]}"


class _Stdout:
    """Records what is written and, at each flush, what had been written by then."""

    def __init__(self):
        self.text, self.flushed = "", []

    def write(self, text):
        self.text += text

    def flush(self):
        self.flushed.append(self.text)


def test_cli_predict_sends_the_version_and_signature_and_prints_indented_json(
    stub, tmp_path, capsys
):
    from serving.client import main

    batch = tmp_path / "batch.json"
    batch.write_text("[[1, 2]]")
    stub.script = [(503, {"error": "busy"}, 0), (200, {"predictions": [[0.5]]}, 0)]
    argv = ["--url", _url(stub), "--model", "m", "--version", "3", "--retries", "1", "predict",
            "--instances-file", str(batch), "--signature-name", "padded"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out == json.dumps({"predictions": [[0.5]]}, indent=2) + "\n"
    assert stub.paths == [("POST", "/v1/models/m/versions/3:predict")] * 2
    assert json.loads(stub.bodies[-1]) == {"instances": [[1, 2]], "signature_name": "padded"}


@pytest.mark.parametrize(
    "body, sent",
    [
        ({"instances": [[1, 2]]}, {"instances": [[1, 2]]}),
        ({"inputs": {"x": [[1]]}, "signature_name": "stream"},
         {"inputs": {"x": [[1]]}, "signature_name": "stream"}),
        ([[3]], {"instances": [[3]]}),
    ],
)  # fmt: skip
def test_cli_predict_sends_a_tensorflow_serving_request_body_as_written(
    stub, tmp_path, capsys, body, sent
):
    """The quick start's own request.json (curl's body) works with `--instances-file`."""
    from serving.client import main

    request = tmp_path / "request.json"
    request.write_text(json.dumps(body))
    stub.script = [(200, {"predictions": [[0.5]]}, 0)]
    argv = ["--url", _url(stub), "--model", "m", "predict", "--instances-file", str(request)]
    assert main(argv) == 0
    assert json.loads(stub.bodies[-1]) == sent
    assert json.loads(capsys.readouterr().out) == {"predictions": [[0.5]]}


def _stream_metadata(version):
    """The metadata body of a `version` whose `stream` takes a sequence and a state of 2."""
    dims = {"dim": [{"size": "-1"}, {"size": "2"}]}
    inputs = {"sequence": {}, "state": {"tensor_shape": dims}}
    return {"model_spec": {"version": version},
            "metadata": {"signature_def": {"signature_def": {"stream": {"inputs": inputs}}}}}


def test_cli_output_into_a_closed_pipe_ends_quietly_with_sigpipe_s_status(stub, tmp_path):
    """`python -m serving.client ... | head -1`: no BrokenPipeError traceback."""
    import numpy as np

    path = tmp_path / "x.npy"
    np.save(path, np.zeros((400, 1), "float32"))
    metadata = _stream_metadata("1")
    answer = {"outputs": {"p": [["x" * 2000]], "state": [[0, 0]]}}
    stub.script = [(200, metadata, 0)] + [(200, answer, 0)] * 400
    command = [sys.executable, "-m", "serving.client", "--url", _url(stub), "--model", "m",
               "stream", "--sequence-file", str(path), "--chunk", "1"]  # fmt: skip
    client = subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    client.stdout.readline()  # one line read, then the reader goes away as `head -1` does
    client.stdout.close()
    _, err = client.communicate(timeout=limit(60))
    assert err.decode() == ""
    assert client.returncode == 128 + signal.SIGPIPE


def test_a_reader_gone_at_the_first_one_step_answer_ends_the_command_quietly(
    stub, tmp_path, monkeypatch
):
    """The same in this process: `--chunk 1` into a pipe whose reader is gone stops at the
    first answer with SIGPIPE's status, and stdout then writes to the null device (so that
    Python's own flush at exit cannot fail again)."""
    import numpy as np

    from serving.client import main

    path = tmp_path / "x.npy"
    np.save(path, np.zeros((3, 1), "float32"))
    metadata = _stream_metadata("1")
    answer = {"outputs": {"p": [[0.5]], "state": [[0, 0]]}}
    stub.script = [(200, metadata, 0)] + [(200, answer, 0)] * 3
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as stdout:
        monkeypatch.setattr("sys.stdout", stdout)
        status = main(["--url", _url(stub), "--model", "m", "stream", "--sequence-file",
                       str(path), "--chunk", "1"])  # fmt: skip
        print("x" * 100_000, file=stdout, flush=True)  # the null device takes it
        monkeypatch.undo()
    assert status == 128 + signal.SIGPIPE
    # Stopped at the first answer: the metadata, then one request of the stream.
    assert stub.paths == [("GET", "/v1/models/m/metadata"),
                          ("POST", "/v1/models/m/versions/1:predict")]  # fmt: skip


def test_the_clients_retry_defaults_are_the_documented_ones():
    """docs/serving.md: `timeout` 10 s, `retries` 3, `backoff` 0.2 s, for every client."""
    import inspect

    from serving.client import GrpcClient, stream

    with GrpcClient("127.0.0.1:8500", "m") as grpc_client:  # no call made: no server needed
        clients = [ServingClient("http://127.0.0.1:8501", "m"), grpc_client]
        settings = [(c.timeout, c.retries, c.backoff) for c in clients]
    parameters = inspect.signature(stream).parameters
    settings.append(tuple(parameters[key].default for key in ("timeout", "retries", "backoff")))
    assert settings == [(10.0, 3, 0.2)] * 3


def test_cli_streams_a_sequence_file_and_flushes_each_answer(stub, tmp_path, monkeypatch):
    import numpy as np

    from serving.client import main

    path = tmp_path / "x.npy"
    np.save(path, np.arange(10, dtype="float32").reshape(5, 2))
    metadata = _stream_metadata("4")
    answers = [{"outputs": {"p": [[0.1 * k]], "state": [[k, k]]}} for k in (1, 2, 3)]
    stub.script = [(200, metadata, 0)] + [(200, a, 0) for a in answers]
    stdout = _Stdout()
    monkeypatch.setattr("sys.stdout", stdout)
    argv = ["--url", _url(stub), "--model", "m", "stream", "--sequence-file", str(path),
            "--chunk", "2"]  # fmt: skip
    assert main(argv) == 0
    lines = [json.dumps({"steps": s, "p": [0.1 * k]}) for s, k in ((2, 1), (4, 2), (5, 3))]
    assert stdout.text == "".join(line + "\n" for line in lines)
    assert stdout.flushed == ["".join(line + "\n" for line in lines[: i + 1]) for i in range(3)]
    sent = [json.loads(body) for body in stub.bodies[1:]]
    assert [b["inputs"]["state"] for b in sent] == [[[0.0, 0.0]], [[1, 1]], [[2, 2]]]
    assert [b["inputs"]["sequence"] for b in sent] == [
        [[[0, 1], [2, 3]]], [[[4, 5], [6, 7]]], [[[8, 9]]]
    ]  # fmt: skip
    assert stub.paths[1:] == [("POST", "/v1/models/m/versions/4:predict")] * 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["predict"], "Received an invalid value for argument `--instances-file`, expected a "
         "JSON file for `predict`, got none."),
        (["stream"], "Received an invalid value for argument `--sequence-file`, expected a .npy "
         "file for `stream`, got none."),
        (["stream", "--sequence-file", "{flat}"], "Received an invalid value for argument "
         "`--sequence-file`, expected a non-empty array of shape (T, m) or (batch, T, m), got "
         "'{flat}' of shape (3,)."),
        (["--retries", "1.5", "status"], "argument --retries: invalid int value: '1.5'"),
        (["stream", "--sequence-file", "{npz}"], "Received an invalid value for argument "
         "`--sequence-file`, expected a .npy file holding one array (np.save), got '{npz}', an "
         ".npz archive of x, y."),
        (["stream", "--sequence-file", "{words}"], "Received an invalid value for argument "
         "`--sequence-file`, expected a .npy file of numbers, got '{words}' of dtype <U3."),
        (["predict", "--instances-file", "{other}"], "Received an invalid value for argument "
         "`--instances-file`, expected a JSON list of instances or a request body "
         '{{"instances": [...]}} or {{"inputs": ...}} (with an optional string '
         "\"signature_name\"), got '{other}' holding an object with keys 'instance'."),
        (["stream", "--sequence-file", "{pickled}"], "Received an invalid value for argument "
         "`--sequence-file`, expected a readable .npy file, got '{pickled}' (Object arrays "
         "cannot be loaded when allow_pickle=False)."),
        (["stream", "--sequence-file", "{empty}"], "Received an invalid value for argument "
         "`--sequence-file`, expected a .npy file holding one array (np.save), got '{empty}', "
         "an .npz archive of no arrays."),
        (["--grpc", "127.0.0.1:1", "predict", "--instances-file", "{keys}"], "Received an "
         "invalid value for argument `--instances-file`, expected instances with the same "
         "keys, got ['a', 'b'], ['a']."),
        (["predict", "--instances-file", "{null}"], "Received an invalid value for argument "
         "`--instances-file`, expected a JSON list of instances or a request body "
         '{{"instances": [...]}} or {{"inputs": ...}} (with an optional string '
         "\"signature_name\"), got '{null}' holding null."),
        (["predict", "--instances-file", "{rows}", "--columnar"], "Received an invalid value for "
         "argument `--columnar`, expected no flag: the file's body names its format "
         "(\"instances\"), got {rows}."),
    ],
)  # fmt: skip
def test_cli_usage_errors_are_the_whole_message(args, message, tmp_path, capsys):
    import numpy as np

    from serving.client import main

    files = {name: str(tmp_path / name) for name in ("flat", "npz", "words", "other", "rows")}
    files = {name: path + (".npz" if name == "npz" else ".npy") for name, path in files.items()}
    files["other"], files["rows"] = str(tmp_path / "other.json"), str(tmp_path / "rows.json")
    files["null"] = str(tmp_path / "null.json")
    (tmp_path / "null.json").write_text("null")
    files["keys"] = str(tmp_path / "keys.json")
    (tmp_path / "keys.json").write_text('{"instances": [{"a": 1}, {"a": 2, "b": 3}]}')
    files["pickled"], files["empty"] = str(tmp_path / "pickled.npy"), str(tmp_path / "empty.npz")
    np.save(files["pickled"], np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(files["empty"])
    flat = files["flat"]
    np.save(flat, np.zeros(3, "float32"))
    np.savez(files["npz"], x=np.zeros((2, 1)), y=np.ones(2))
    np.save(files["words"], np.array(["abc", "de"]))
    (tmp_path / "other.json").write_text('{"instance": [[1]]}')
    (tmp_path / "rows.json").write_text('{"instances": [[1]]}')
    message = message.format(**files)
    args = [arg.format(**files) for arg in args]
    try:
        status = main(["--model", "m", *args])
    except SystemExit as stopped:  # argparse's own errors exit from parse_args
        status = stopped.code
    assert status == 2
    assert capsys.readouterr().err == f"python -m serving.client: error: {message}\n"


def test_cli_needs_a_model_and_documents_its_flags(capsys):
    from serving.client import main

    with pytest.raises(SystemExit) as stopped:
        main(["status"])
    assert stopped.value.code == 2
    assert "the following arguments are required: --model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        '--instances-file INSTANCES_FILE a request body ({"instances": ...} or {"inputs": ...}) '
        "or a JSON list (predict)"
    ) in help_text
    assert "--chunk CHUNK steps per request (default 28)" in help_text


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"error": "bad \xff input"}', "bad \ufffd input"),  # undecodable bytes replaced
        (b"plain text", "plain text"),
        (b'{"other": 1}', '{"other": 1}'),
        (b"[1]", "[1]"),
        (b"", "Bad Request"),  # no body: the status line's reason
    ],
)
def test_an_error_answer_s_message_is_its_error_field_else_its_text(stub, body, message):
    stub.script = [(400, body, 0)]
    with pytest.raises(ServingError) as error:
        _client(stub).status()
    assert (error.value.status, error.value.message) == (400, message)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ServingClient("ftp://127.0.0.1", "m"), "argument `url`, expected an http:// or "
         "https:// URL with a host, e.g. http://127.0.0.1:8501, got 'ftp://127.0.0.1'."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m", timeout=0), "argument `timeout`, "
         "expected a positive number of seconds, got 0."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m", timeout="5"), "argument `timeout`, "
         "expected a positive number of seconds, got '5'."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m", retries=-1), "argument `retries`, "
         "expected a non-negative integer, got -1."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m", timeout=True), "argument "
         "`timeout`, expected a positive number of seconds, got True."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m", timeout=float("nan")), "argument "
         "`timeout`, expected a positive number of seconds, got nan."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m", timeout=float("inf")), "argument "
         "`timeout`, expected a positive number of seconds, got inf."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m", backoff=-0.1), "argument "
         "`backoff`, expected a non-negative number of seconds, got -0.1."),
        (lambda: GrpcClient("127.0.0.1:8500", "m", backoff="0.2"), "argument `backoff`, "
         "expected a non-negative number of seconds, got '0.2'."),
        (lambda: GrpcClient("127.0.0.1:8500", "m", backoff=False), "argument `backoff`, "
         "expected a non-negative number of seconds, got False."),
        (lambda: GrpcClient("127.0.0.1:8500", "m", retries=True), "argument `retries`, "
         "expected a non-negative integer, got True."),
        (lambda: ServingClient("http://127.0.0.1:8501", "a/b"), "argument `model`, expected a "
         "name usable in /v1/models/NAME (not empty, no '/', ':' or control characters), "
         "got 'a/b'."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m").predict(), "argument `instances`, "
         "expected exactly one of `instances` and `inputs`, got neither."),
        (lambda: ServingClient("http://127.0.0.1:8501", "m").predict(instances=[1], inputs=[1]),
         "argument `instances`, expected exactly one of `instances` and `inputs`, got both."),
    ],
)  # fmt: skip
def test_invalid_arguments_are_the_whole_message(make, message):
    with pytest.raises(ValueError) as caught:
        make()
    assert str(caught.value) == f"Received an invalid value for {message}"


def test_a_body_is_sent_as_json_or_as_given_bytes_and_a_get_has_none(stub):
    stub.script = [(200, {}, 0)] * 3
    client = _client(stub)
    url = f"{_url(stub)}/v1/models/m:predict"
    client.request("POST", url, b'{"instances": [1]}')
    client.request("POST", url, {"instances": [2]})
    client.request("GET", f"{_url(stub)}/v1/models/m")
    assert stub.bodies == [b'{"instances": [1]}', b'{"instances":[2]}', b""]  # sent as given
    assert stub.types == ["application/json", "application/json", None]


def test_float32_arrays_are_sent_in_their_shortest_exact_form():
    """Every float32, from subnormal to max, reads back bit for bit after the server's
    float32 cast, in fewer characters than its float64 digits; other values are JSON's."""
    import json

    import numpy as np

    from serving.client import encode_json

    rng = np.random.default_rng(7)
    finfo = np.finfo(np.float32)
    special = [0.0, -0.0, 0.1, 1.0, -2.5, finfo.max, -finfo.max, finfo.tiny,
               finfo.smallest_subnormal, 1e-8, 3.4e38, 16777217.0]  # fmt: skip
    values = np.concatenate([
        np.asarray(special, "float32"),
        rng.standard_normal(500).astype("float32") * 10.0 ** rng.integers(-30, 30, 500),
    ]).astype("float32")  # fmt: skip
    text = encode_json({"instances": values.reshape(-1, 4)})
    back = np.asarray(json.loads(text)["instances"], "float32").ravel()
    assert back.tobytes() == values.tobytes()
    assert len(text) < 0.75 * len(json.dumps({"instances": values.reshape(-1, 4).tolist()}))
    assert encode_json([np.float32(0.1), np.float32(3)]) == b"[0.1,3.0]"
    assert encode_json({"a": np.arange(3), "b": (np.float64(0.1), "x", None, True)}) == (
        b'{"a":[0,1,2],"b":[0.1,"x",null,true]}'
    )
    # Not finite: written as json.dumps writes it, which the server refuses with a 400.
    assert encode_json(np.asarray([np.inf, np.nan], "float32")) == b"[Infinity,NaN]"


class _EchoStream(StreamingClient):
    """A client whose server streams back the states it was sent, as float64, one output."""

    def __init__(self):
        super().__init__("m", timeout=1, retries=0, backoff=0)
        self.sent, self.asked = [], []

    def metadata(self, version=None):
        self.asked.append(version)
        dim = [{"size": "-1"}, {"size": "2"}]
        inputs = {"sequence": {"tensor_shape": {"dim": [*dim[:1], *dim]}},
                  "state_a_0": {"tensor_shape": {"dim": dim}}}  # fmt: skip
        return {
            "model_spec": {"version": "3"},
            "metadata": {"signature_def": {"signature_def": {"stream": {"inputs": inputs}}}},
        }

    def _predict_stream(self, version, inputs):
        self.sent.append(inputs)
        state = inputs["state_a_0"].astype("float64") + 1 / 3
        return {"state_a_0": state, "value": state.sum(-1)}


def test_a_stream_sends_float32_states_and_refuses_a_chunk_of_another_rank_whole():
    client = _EchoStream()
    answers = list(client.stream([[[0.5, 1.0]], [[0.5, 1.0], [2.0, 3.0]]]))
    assert [answer["value"] for answer in answers] == pytest.approx([2 / 3, 4 / 3])
    assert [sent["state_a_0"].dtype for sent in client.sent] == ["float32", "float32"]
    with pytest.raises(ValueError) as refused:
        list(client.stream([[1.0, 2.0]]))
    assert str(refused.value) == (
        "Received an invalid value for argument `chunks`, expected arrays of shape (t, m) "
        "or (batch, t, m), got [1.0, 2.0]."
    )
    list(client.stream([[[1.0, 2.0]]], version=3))
    assert client.asked == [None, None, 3]  # the version asked for, read once a stream
