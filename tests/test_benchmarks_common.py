"""`benchmarks.common` and what the benchmark entry points share: output, children, timing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import common

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
        "from benchmarks import run, accelerator, gpu_kernel_check\n"
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
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["heavy"] == []
    for text in answer["helps"]:
        assert "default runs/benchmarks" in " ".join(text.split()), text
    assert common.DEFAULT_OUTPUT == os.path.join("runs", "benchmarks")


def test_markdown_of_the_committed_results_is_the_committed_markdown():
    """The JSON keys and the tables stay as the committed results have them."""
    from benchmarks import run

    results = json.loads((RESULTS / "results.json").read_text())
    assert run.markdown(results) == (RESULTS / "results.md").read_text()


def test_accelerator_markdown_reads_the_committed_results():
    from benchmarks import accelerator

    found = common.read_backend_results(str(RESULTS), "accelerator-{}.json", ["jax", "torch"])
    text = accelerator.markdown(found)
    assert text.startswith("### jax on ") and "### torch on " in text
    assert "| training step (s) | AntisymmetricRNN |" in text
