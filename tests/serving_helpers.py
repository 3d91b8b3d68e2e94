"""Helpers for the serving tests: tiny trained models, exports, servers on 127.0.0.1."""

import atexit
import functools
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import keras

from keras_antisym import AntisymmetricRNN, GatedAntisymmetricRNN
from tests.limits import limit

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_KINDS = ("antisymmetric", "gated", "ablation", "lstm")
STEPS, FEATURES, UNITS = 64, 1, 8  # sklearn digits as 64 time steps of 1 pixel
SERVER_START_SECONDS = 90

# Run as a prefix script: makes `keras`, `keras_antisym` and `tf_keras` unimportable,
# then runs the module named in argv[1]. The finder still *finds* them (so that
# TensorFlow's lazy `tf.keras` set-up, which calls `find_spec("keras")`, does not
# break) but importing them raises ImportError.
NO_KERAS_PRELUDE = """
import importlib.abc, importlib.machinery, runpy, sys
BLOCKED = ("keras", "keras_antisym", "tf_keras")
class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        raise ImportError(f"{spec.name} is blocked in this process")
    def exec_module(self, module):
        raise ImportError("blocked")
class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return importlib.machinery.ModuleSpec(name, _Loader())
        return None
sys.meta_path.insert(0, _Blocker())
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
"""

_WORK_DIR = tempfile.mkdtemp(prefix="serving-tests-")
atexit.register(shutil.rmtree, _WORK_DIR, ignore_errors=True)


def work_dir(*parts):
    """A path under this test session's temporary folder."""
    return os.path.join(_WORK_DIR, *parts)


@functools.cache
def digits():
    """sklearn digits as float32 `(n, 64, 1)` sequences in [0, 1] and int labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images.reshape(-1, STEPS, FEATURES) / 16.0).astype("float32")
    return x, data.target.astype("int32")


def build_model(kind):
    """A tiny classifier of `kind` producing logits, as the training CLI builds them."""
    recurrent = {
        "antisymmetric": lambda: AntisymmetricRNN(UNITS, epsilon=0.1, gamma=0.01),
        "gated": lambda: GatedAntisymmetricRNN(UNITS, epsilon=0.1, gamma=0.01),
        "ablation": lambda: GatedAntisymmetricRNN(UNITS, antisymmetric=False),
        "lstm": lambda: keras.layers.LSTM(UNITS, unit_forget_bias=True),
    }[kind]
    return keras.Sequential(
        [keras.Input((STEPS, FEATURES)), recurrent(), keras.layers.Dense(10)], name=kind
    )


@functools.cache
def trained_model(kind):
    """A model of `kind` fit for a few steps on digits with a fixed seed."""
    keras.utils.set_random_seed(0)
    model = build_model(kind)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = digits()
    model.fit(x[:256], y[:256], batch_size=64, epochs=1, verbose=0)
    return model


@functools.cache
def exported(kind, version=1):
    """`(model, export_base)`: the trained model of `kind` saved as `.keras`, then exported."""
    from serving.exports.export import export_model

    model = trained_model(kind)
    keras_path = work_dir(f"{kind}.keras")
    if not os.path.exists(keras_path):
        model.save(keras_path)
    base = work_dir("models", kind)
    export_model(keras_path, base, version)
    return model, base


class ServerProcess:
    """`python -m serving.server` in a subprocess on a free port of 127.0.0.1.

    Args:
        base_path: The model base path to serve.
        name: The model name.
        block_keras: Run with `keras`/`keras_antisym` unimportable.
        extra_args: More command-line flags.
        nofile: Open-file limit of the server process (`ulimit -n`), or None.
    """

    def __init__(self, base_path, name, block_keras=True, extra_args=(), nofile=None):
        args = ["--model-base-path", base_path, "--model-name", name, "--port", "0"]
        args += ["--grpc-port", "0"]
        args += list(extra_args)
        if block_keras:
            code = NO_KERAS_PRELUDE + "runpy.run_module('serving.server', run_name='__main__')"
            command = [sys.executable, "-c", code, *args]
        else:
            command = [sys.executable, "-m", "serving.server", *args]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=(lambda: _limit_files(nofile)) if nofile else None,
        )
        self.log = []
        self.grpc_target = None  # HOST:PORT of its gRPC API, from the line after the URL's
        self.url = self._wait_for_url()

    def _wait_for_url(self):
        found = {}

        def read():
            for line in self.process.stdout:
                self.log.append(line)
                match = re.match(r"Serving \S+ on (http://\S+)", line)
                if match and "url" not in found:
                    found["url"] = match[1]
                match = re.match(r"Serving \S+ over gRPC on (\S+)", line)
                if match:
                    self.grpc_target = match[1]

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + SERVER_START_SECONDS
        while time.monotonic() < deadline and "url" not in found:
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        if "url" not in found:
            self.stop()
            raise RuntimeError("serving.local.server did not start:\n" + "".join(self.log[-30:]))
        return found["url"]

    def stop(self):
        """Terminate the server and wait for it (kill after a timeout)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=limit(10))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=limit(10))


def _limit_files(count):
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


class ThreadServer:
    """`serving.server.make_server` served from a thread of this process."""

    def __init__(self, base_path, name, **kwargs):
        from serving.local.server import make_server

        self.server = make_server(base_path, name, host="127.0.0.1", port=0, **kwargs)
        host, port = self.server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        """Shut the server down and release its port."""
        self.server.shutdown()
        self.server.close()
        self.thread.join(timeout=limit(10))


HTTP_TIMEOUT = limit(30)  # seconds an answer may take here


def http_call(url, method="GET", body=None, headers=None, timeout=HTTP_TIMEOUT):
    """One raw HTTP request: `(status, decoded JSON body or raw text)`."""
    match = re.match(r"http://([^/:]+):(\d+)(/.*)?$", url)
    conn = http.client.HTTPConnection(match[1], int(match[2]), timeout=timeout)
    try:
        if isinstance(body, dict | list):
            body = json.dumps(body)
        conn.request(method, match[3] or "/", body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read().decode("utf-8", "replace")
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw


def raw_http(url, data, idle=1.0, deadline=20.0, head=False):
    """Send raw bytes on one connection and read until the server closes or goes quiet.

    `head`: the requests are HEAD, so the responses carry no body.

    Returns:
        `(responses, closed)`: each response `(status, headers, body)` in order
        (headers lower-cased), and whether the server closed the connection.
    """
    import socket

    host, port = re.match(r"http://([^/:]+):(\d+)", url).groups()
    received, closed = b"", False
    with socket.create_connection((host, int(port)), timeout=idle) as sock:
        try:
            sock.sendall(data)
        except OSError:  # the server may answer and close before reading everything
            pass
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    return _split_responses(received, bodiless=head), closed


def _split_responses(data, bodiless=False):
    responses = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            responses.append((None, {}, data))  # not HTTP: counted as a broken answer
            break
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else None
        headers = dict(
            (k.strip().lower(), v.strip())
            for k, _, v in (line.partition(":") for line in lines[1:])
        )
        length = 0 if bodiless else int(headers.get("content-length", len(rest)))
        responses.append((status, headers, rest[:length]))
        data = rest[length:]
    return responses


SMUGGLED = b"GET /v1/models/NOPE_SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n"


def _request(first, headers=(), body=b""):
    lines = "".join(f"{key}: {value}\r\n" for key, value in headers)
    return f"{first}\r\nHost: x\r\n{lines}\r\n".encode("latin-1") + body


def _chunked(data):
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)


def raw_bad_requests(model, max_body_bytes):
    """`(case, bytes, closes)`: HTTP the local server must answer with one JSON 4xx.

    `closes`: the framing is broken, so the server must also close the connection.
    Several carry `SMUGGLED` where a lax parser would read a second request.
    """
    predict, status = f"/v1/models/{model}:predict", f"/v1/models/{model}"
    post = f"POST {predict} HTTP/1.1"
    cl = "Content-Length"
    return [
        ("two Content-Lengths", _request(post, [(cl, 0), (cl, len(SMUGGLED))], SMUGGLED), True),
        ("Content-Length -1", _request(post, [(cl, "-1")], SMUGGLED), True),
        ("Content-Length +5", _request(post, [(cl, "+5")], b"{}   " + SMUGGLED), True),
        ("Content-Length 0x10", _request(post, [(cl, "0x10")], SMUGGLED), True),
        ("Content-Length, chunked", _request(post, [("Transfer-Encoding", "chunked"), (cl, 5)],
                                             b"0\r\n\r\n" + SMUGGLED), True),
        ("chunked on HTTP/1.0", _request(f"POST {predict} HTTP/1.0",
                                         [("Connection", "keep-alive"),
                                          ("Transfer-Encoding", "chunked")],
                                         b"0\r\n\r\n" + SMUGGLED), True),
        ("Transfer-Encoding gzip", _request(post, [("Transfer-Encoding", "gzip")], SMUGGLED), True),
        ("bad chunk size", _request(post, [("Transfer-Encoding", "chunked")], b"zz\r\n" + SMUGGLED),
         True),
        ("chunked GET, unknown route", _request("GET /nope HTTP/1.1",
                                                [("Transfer-Encoding", "chunked")],
                                                _chunked(SMUGGLED)), False),
        ("chunked POST, wrong route", _request(f"POST {status} HTTP/1.1",
                                               [("Transfer-Encoding", "chunked")],
                                               _chunked(SMUGGLED)), False),
        ("body on unknown route", _request("POST /x HTTP/1.1", [(cl, len(SMUGGLED))], SMUGGLED),
         False),
        ("garbage request line", b"HELLO THERE\r\n\r\n" + SMUGGLED, True),
        ("lower-case method", _request(f"get {status} HTTP/1.1"), True),
        ("bare LF line ends", f"GET {status} HTTP/1.1\nHost: x\n\n".encode() + SMUGGLED, True),
        ("header without colon", _request(f"GET {status} HTTP/1.1", [("X", "y")]).replace(
            b"X: y", b"Xy"), True),
        ("space before colon", _request(f"GET {status} HTTP/1.1").replace(
            b"Host:", b"Host :"), True),
        ("NUL in a header", _request(f"GET {status} HTTP/1.1", [("X-A", "a\0b")]), True),
        ("TRACE", _request(f"TRACE {status} HTTP/1.1"), False),
        ("CONNECT", _request("CONNECT example.com:443 HTTP/1.1"), False),
        ("unknown method", _request(f"BREW {predict} HTTP/1.1"), False),
        ("100 KB path", _request(f"GET /{'a' * 100_000} HTTP/1.1"), True),
        ("2,000 headers", _request(f"GET {status} HTTP/1.1", [(f"X-{i}", "v" * 60)
                                                              for i in range(2000)]), True),
        ("body over the cap", _request(post, [(cl, max_body_bytes + 1)]), True),
        ("chunked body over the cap", _request(post, [("Transfer-Encoding", "chunked")],
                                               _chunked(b" " * (max_body_bytes + 1))), True),
        ("deep nesting", _request(post, [(cl, 200_000)], b"[" * 100_000 + b"]" * 100_000), False),
        ("invalid UTF-8 path", _request("GET /v1/models/\xff\xfe HTTP/1.1"), False),
        ("non-digit version", _request(f"GET {status}/versions/%C2%B2 HTTP/1.1"), False),
    ]  # fmt: skip
