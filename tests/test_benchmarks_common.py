"""`benchmarks.common` and what the benchmark entry points share: output, children, timing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import common
from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ENTRY_POINTS = ("benchmarks.run", "benchmarks.accelerator", "benchmarks.gpu_kernel_check")


def test_table_is_markdown():
    assert common.table(["a", "b"], [(1, "x"), ("2", 3.5)]) == [
        "| a | b |",
        "|---|---|",
        "| 1 | x |",
        "| 2 | 3.5 |",
    ]


def test_interleaved_runs_round_robin_after_warmup():
    calls = []
    timings = common.interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1
    )
    assert calls == ["a", "b"] + ["a", "b"] * 3
    for timing in timings.values():
        assert timing["repeats"] == 3
        assert 0 <= timing["min"] <= timing["median"] <= timing["max"]


def test_run_child_returns_stdout_and_raises_with_stderr():
    assert common.last_json(common.run_child(["-c", "print('x'); print('[1, 2]')"], 60)) == [1, 2]
    env = {"BENCH_VALUE": "7"}
    assert common.run_child(["-c", "import os; print(os.environ['BENCH_VALUE'])"], 60, env) == "7\n"
    failing = "import sys; print('broken', file=sys.stderr); sys.exit(3)"
    with pytest.raises(common.ChildError, match="exit status 3\n.*broken"):
        common.run_child(["-c", failing], 60)
    with pytest.raises(common.ChildError, match="stopped after 1 s"):
        common.run_child(["-c", "import time; time.sleep(30)"], 1)


def test_read_backend_results_keeps_those_that_exist(tmp_path):
    common.write_json(str(tmp_path / "x-jax.json"), {"a": 1})
    found = common.read_backend_results(str(tmp_path), "x-{}.json", ["jax", "torch"])
    assert found == {"jax": {"a": 1}}
    assert not [name for name in os.listdir(tmp_path) if ".partial" in name]


def test_run_sections_writes_after_each_piece_and_keeps_going(tmp_path):
    path = str(tmp_path / "sections.json")
    seen = []

    def good(part):
        part["first"] = 1
        yield
        seen.append(json.loads(Path(path).read_text())["good"])
        part["second"] = 2
        yield

    def bad(part):
        part["kept"] = True
        yield
        raise ZeroDivisionError("measured nothing")

    results = common.run_sections(path, {}, [("good", good, {}), ("bad", bad, {})], keep_going=True)
    assert seen == [{"first": 1}]  # written after the first piece
    assert results["bad"] == {"kept": True, "error": "ZeroDivisionError: measured nothing"}
    assert json.loads(Path(path).read_text())["good"] == {"first": 1, "second": 2}
    with pytest.raises(ZeroDivisionError):
        common.run_sections(path, {}, [("bad", bad, {})])


def test_entry_points_import_no_keras_and_default_to_runs():
    """The parents choose a backend per child: importing the entry points must not import Keras."""
    code = (
        "import contextlib, io, json, sys\n"
        "from benchmarks import run, accelerator, gpu_kernel_check, tables\n"
        "helps = []\n"
        "for module in (run, accelerator, gpu_kernel_check):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        module.main(['--help'])\n"
        "    helps.append(out.getvalue())\n"
        "heavy = [m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules]\n"
        "print(json.dumps({'heavy': heavy, 'helps': helps}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=limit(120)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["heavy"] == []
    for text in answer["helps"]:
        assert "default runs/benchmarks" in " ".join(text.split()), text
    assert common.DEFAULT_OUTPUT == os.path.join("runs", "benchmarks")


def test_markdown_of_the_committed_results_is_the_committed_markdown():
    """The JSON keys and the tables stay as the committed results have them."""
    from benchmarks import tables

    results = json.loads((RESULTS / "results.json").read_text())
    assert tables.markdown(results) == (RESULTS / "results.md").read_text()


def test_accelerator_markdown_reads_the_committed_results():
    from benchmarks import accelerator

    found = common.read_backend_results(str(RESULTS), "accelerator-{}.json", ["jax", "torch"])
    text = accelerator.markdown(found)
    assert text.startswith("### jax on ") and "### torch on " in text
    assert "| training step (s) | AntisymmetricRNN |" in text


def _words(text):
    return " ".join(text.split())


def test_parser_flags_defaults_and_help():
    plain = common.parser("bench", "What it measures.")
    assert vars(plain.parse_args([])) == {"quick": False, "output": common.DEFAULT_OUTPUT}
    assert vars(plain.parse_args(["--quick", "--output", "out"])) == {
        "quick": True, "output": "out"
    }  # fmt: skip
    help_text = _words(plain.format_help())
    assert help_text.startswith("usage: bench [-h] [--quick] [--output OUTPUT] What it measures.")
    assert "--quick tiny shapes (smoke test)" in help_text
    assert f"--output OUTPUT results folder (default {common.DEFAULT_OUTPUT})" in help_text
    assert "--backends" not in help_text
    with pytest.raises(SystemExit) as stopped:
        plain.parse_args(["--backends", "jax"])
    assert stopped.value.code == 2

    children = common.parser("bench", "doc", backends=90)
    assert vars(children.parse_args([])) == {
        "quick": False, "output": common.DEFAULT_OUTPUT, "backends": "jax,torch",
        "timeout": 90, "child": False,
    }  # fmt: skip
    given = children.parse_args(["--backends", "torch", "--timeout", "2.5", "--child"])
    assert (given.backends, given.timeout, given.child) == ("torch", 2.5, True)
    help_text = _words(children.format_help())
    assert "--backends BACKENDS comma list of Keras backends" in help_text
    assert "--timeout TIMEOUT seconds per backend" in help_text
    assert "--child" not in help_text  # the children's flag is hidden


def test_environment_describes_this_process():
    import platform

    import keras
    import tensorflow as tf

    info = common.environment()
    assert info == {
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "processor": platform.processor(),
        "tensorflow": tf.__version__,
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
    }
    json.dumps(info)  # written into the results as it is


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_environment_names_the_framework_of_a_jax_or_torch_process(backend):
    """In a child on that backend (this process keeps TensorFlow's): the framework's own
    version, and its device where JAX names one or PyTorch has CUDA."""
    code = (
        "import json, keras\n"
        "from benchmarks import common\n"
        f"import {backend} as framework\n"
        "info = common.environment()\n"
        "if keras.backend.backend() == 'jax':\n"
        "    device = str(framework.devices()[0].device_kind)\n"
        "else:\n"
        "    cuda = framework.cuda.is_available()\n"
        "    device = framework.cuda.get_device_name(0) if cuda else None\n"
        "print(json.dumps({'info': info, 'version': framework.__version__, 'device': device}))\n"
    )
    env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=limit(120))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    info = answer["info"]
    assert info["backend"] == backend and info[backend] == answer["version"]
    assert ("jax" if backend == "torch" else "torch") not in info
    assert info.get("device") == answer["device"]


def test_run_backends_runs_one_child_per_backend_and_names_the_failed(monkeypatch, capsys):
    calls = []

    def run_child(args, timeout, env, capture=True):
        calls.append((args, timeout, env, capture))
        if env["KERAS_BACKEND"] == "torch":
            raise common.ChildError("-m bench: exit status 1\nTraceback (most recent call last):")

    monkeypatch.setattr(common, "run_child", run_child)
    failed = common.run_backends("bench", ["jax", "torch"], "out", True, 30.0, ["--layer", "x"])
    assert failed == ["torch"]
    expected_args = ["-m", "bench", "--child", "--output", "out", "--quick", "--layer", "x"]
    assert calls == [
        (expected_args, 30.0, {"KERAS_BACKEND": b, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, False)
        for b in ("jax", "torch")
    ]
    assert capsys.readouterr().err == "torch: -m bench: exit status 1\n"
    calls.clear()
    assert common.run_backends("bench", ["jax"], "out", False, 5.0) == []
    assert calls[0][0] == ["-m", "bench", "--child", "--output", "out"]


def test_a_child_whose_output_is_not_captured_returns_nothing():
    assert common.run_child(["-c", "pass"], 60, capture=False) == ""


def test_sections_are_written_with_the_indent_and_announced_at_once(tmp_path, monkeypatch):
    import keras

    class Stdout:
        def __init__(self):
            self.text, self.flushed = "", []

        def write(self, text):
            self.text += text

        def flush(self):
            self.flushed.append(self.text)

    during = []

    def bench(part):
        part["x"] = [1, 2]
        yield
        during.append(Path(path).read_text())

    path = str(tmp_path / "r.json")
    stdout = Stdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    results = common.run_sections(path, {}, [("first", bench, {})])
    monkeypatch.undo()
    assert Path(path).read_text() == json.dumps(results, indent=2)
    assert during == [json.dumps(json.loads(during[0]), indent=2)]  # each piece: indented too
    assert stdout.text == f"{keras.backend.backend()}: first done in 0 s\n"
    assert stdout.flushed == [stdout.text]  # flushed: a parent shows a child's progress live
    assert 0 <= results["first_seconds"] < 5

    seen = []

    def watched(part):
        part["y"] = 1
        yield
        seen.append(Path(path).read_text())

    common.run_sections(path, {}, [("second", watched, {})], indent=None)
    assert seen == [json.dumps(json.loads(seen[0]))]  # compact, piece by piece as at the end
    assert Path(path).read_text() == json.dumps(json.loads(Path(path).read_text()))


def test_write_json_and_write_text(tmp_path):
    common.write_json(str(tmp_path / "a.json"), {"a": [1]})
    assert (tmp_path / "a.json").read_text() == '{\n  "a": [\n    1\n  ]\n}'
    common.write_text(str(tmp_path / "b.md"), "# title\n")
    assert (tmp_path / "b.md").read_text() == "# title\n"
