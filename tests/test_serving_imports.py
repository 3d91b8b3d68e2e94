"""`serving/`: routing, HTTP server and client import no TensorFlow; the CLIs' --help is fast."""

import json
import os
import subprocess
import sys

import pytest

from tests.limits import limit
from tests.serving_helpers import REPO_ROOT

HEAVY = ("tensorflow", "keras", "keras_antisym", "jax", "torch", "ai_edge_litert", "onnx",
         "onnxruntime", "tf2onnx")  # fmt: skip


def _modules_after(code):
    """The heavy modules in `sys.modules` after running `code` in a fresh interpreter."""
    listed = f"[m for m in {HEAVY!r} if m in sys.modules]"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({listed}))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=limit(120),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_serving_modules_imports_no_tensorflow():
    modules = ", ".join([
        "serving", "serving.client", "serving.codes", "serving.demo", "serving.export",
        "serving.server", "serving.local.rest", "serving.local.httpd", "serving.local.server",
        "serving.local.payload", "serving.local.repository", "serving.local.model_config",
        "serving.local.tensors", "serving.exports.export", "serving.exports.litert",
        "serving.exports.onnxgraphs", "serving.exports.runtimes", "serving.exports.steploop",
        "serving.exports.tfloop",
    ])  # fmt: skip
    assert _modules_after(f"import {modules}") == []


@pytest.mark.parametrize("module", ["export", "server", "client", "demo"])
def test_cli_parser_imports_no_tensorflow(module):
    """Building the parser and answering --help stays in the standard library and waitress."""
    code = (
        "import contextlib, io\n"
        f"from serving.{module} import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])"
    )
    assert _modules_after(code) == []


def test_export_help_answers_at_once():
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "serving.export", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=limit(60),
    )
    assert done.returncode == 0 and "--export-base" in done.stdout
    # Cumulative microseconds of the slowest top-level import: well under a second.
    slowest = max(
        int(line.split("|")[1])
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and line.split("|")[1].strip().isdigit()
    )
    assert slowest < 500_000, slowest
