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
    from serving.export import export_model

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
    """

    def __init__(self, base_path, name, block_keras=True, extra_args=()):
        args = ["--model-base-path", base_path, "--model-name", name, "--port", "0"]
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
        )
        self.log = []
        self.url = self._wait_for_url()

    def _wait_for_url(self):
        found = {}

        def read():
            for line in self.process.stdout:
                self.log.append(line)
                match = re.match(r"Serving \S+ on (http://\S+)", line)
                if match and "url" not in found:
                    found["url"] = match[1]

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + SERVER_START_SECONDS
        while time.monotonic() < deadline and "url" not in found:
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        if "url" not in found:
            self.stop()
            raise RuntimeError("serving.server did not start:\n" + "".join(self.log[-30:]))
        return found["url"]

    def stop(self):
        """Terminate the server and wait for it (kill after a timeout)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


class ThreadServer:
    """`serving.server.make_server` served from a thread of this process."""

    def __init__(self, base_path, name, **kwargs):
        from serving.server import make_server

        self.server = make_server(base_path, name, host="127.0.0.1", port=0, **kwargs)
        host, port = self.server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        """Shut the server down and release its port."""
        self.server.shutdown()
        self.server.repository.stop()
        self.server.server_close()
        self.thread.join(timeout=10)


def http_call(url, method="GET", body=None, headers=None, timeout=30):
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
