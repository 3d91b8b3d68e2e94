"""scripts/mutation_verdicts.py: mutmut's verdicts saved to a committed file and restored.

The meta files are written here in mutmut 3's format (the keys its
`SourceFileMutationData.load` requires); the expected contents are written out by hand.
"""

import importlib.util
import json
import os
import pathlib
import random
import tempfile
import time

import pytest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "mutation_verdicts.py"


@pytest.fixture(scope="module")
def verdicts():
    spec = importlib.util.spec_from_file_location("mutation_verdicts", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _meta(codes, hashes):
    return {
        "exit_code_by_key": codes,
        "hash_by_function_name": hashes,
        "type_check_error_by_key": {},
        "durations_by_key": {"pkg.mod.x_f__mutmut_1": 0.5},
        "estimated_durations_by_key": {},
    }


def _write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def _tree(root):
    """A mutants/ folder: pkg/mod.py with functions f (2 mutants) and C.g (2 mutants)."""
    codes = {
        "pkg.mod.x_f__mutmut_1": 1,
        "pkg.mod.x_f__mutmut_2": 0,
        "pkg.mod.xǁCǁg__mutmut_1": None,
        "pkg.mod.xǁCǁg__mutmut_2": 33,
    }
    _write(root / "pkg" / "mod.py.meta", _meta(codes, {"x_f": "hf", "xǁCǁg": "hg"}))
    recheck = {"status": "killed", "hash": "hf", "detail": ""}
    _write(root / "backend-verdicts.json", {"pkg.mod.x_f__mutmut_2": {"tensorflow": recheck}})
    return codes


def test_save_keeps_every_mutant_its_verdict_the_hashes_and_the_rechecks(verdicts, tmp_path):
    _tree(tmp_path / "mutants")
    store = tmp_path / "store.json"
    assert verdicts.save(tmp_path / "mutants", store) == 3
    saved = json.loads(store.read_text())
    assert saved["files"] == {
        "pkg/mod.py": {
            "hash_by_function_name": {"x_f": "hf", "xǁCǁg": "hg"},
            "exit_code_by_key": {
                "pkg.mod.x_f__mutmut_1": 1,
                "pkg.mod.x_f__mutmut_2": 0,
                "pkg.mod.xǁCǁg__mutmut_1": None,
                "pkg.mod.xǁCǁg__mutmut_2": 33,
            },
        }
    }
    assert saved["rechecks"]["pkg.mod.x_f__mutmut_2"]["tensorflow"]["hash"] == "hf"


def test_save_replaces_the_files_it_has_and_keeps_the_others(verdicts, tmp_path):
    store = tmp_path / "store.json"
    other = {
        "hash_by_function_name": {"x_h": "hh"},
        "exit_code_by_key": {"pkg.other.x_h__mutmut_1": 1},
    }
    stale = {
        "hash_by_function_name": {"x_f": "old"},
        "exit_code_by_key": {"pkg.mod.x_f__mutmut_9": 1},
    }
    store.write_text(
        json.dumps({"files": {"pkg/other.py": other, "pkg/mod.py": stale}, "rechecks": {}})
    )
    _tree(tmp_path / "mutants")
    verdicts.save(tmp_path / "mutants", store)
    files = json.loads(store.read_text())["files"]
    assert files["pkg/other.py"] == other
    assert "pkg.mod.x_f__mutmut_9" not in files["pkg/mod.py"]["exit_code_by_key"]
    assert files["pkg/mod.py"]["hash_by_function_name"]["x_f"] == "hf"


def test_restore_into_a_fresh_tree_writes_meta_files_mutmut_can_load(verdicts, tmp_path):
    _tree(tmp_path / "before")
    store = tmp_path / "store.json"
    verdicts.save(tmp_path / "before", store)
    fresh = tmp_path / "after"
    assert verdicts.restore(store, fresh) == 3
    meta = json.loads((fresh / "pkg" / "mod.py.meta").read_text())
    # Every key mutmut's loader pops, and nothing else (it asserts that).
    assert set(meta) == {
        "exit_code_by_key", "hash_by_function_name", "type_check_error_by_key",
        "durations_by_key", "estimated_durations_by_key",
    }  # fmt: skip
    assert meta["exit_code_by_key"] == {
        "pkg.mod.x_f__mutmut_1": 1,
        "pkg.mod.x_f__mutmut_2": 0,
        "pkg.mod.xǁCǁg__mutmut_1": None,
        "pkg.mod.xǁCǁg__mutmut_2": 33,
    }
    assert meta["hash_by_function_name"] == {"x_f": "hf", "xǁCǁg": "hg"}
    rechecks = json.loads((fresh / "backend-verdicts.json").read_text())
    assert rechecks["pkg.mod.x_f__mutmut_2"]["tensorflow"]["status"] == "killed"


def test_restore_fills_only_unchecked_mutants_of_unchanged_functions(verdicts, tmp_path):
    store = tmp_path / "store.json"
    entry = {
        "hash_by_function_name": {"x_f": "hf", "xǁCǁg": "changed"},
        "exit_code_by_key": {
            "pkg.mod.x_f__mutmut_1": 0,  # decided locally as 1: the local verdict stays
            "pkg.mod.xǁCǁg__mutmut_1": 1,  # unchecked locally, but g's hash differs
        },
    }
    store.write_text(json.dumps({"files": {"pkg/mod.py": entry}, "rechecks": {}}))
    mutants = tmp_path / "mutants"
    codes = _tree(mutants)
    assert verdicts.restore(store, mutants) == 0
    assert json.loads((mutants / "pkg" / "mod.py.meta").read_text())["exit_code_by_key"] == codes
    entry["hash_by_function_name"]["xǁCǁg"] = "hg"
    store.write_text(json.dumps({"files": {"pkg/mod.py": entry}, "rechecks": {}}))
    assert verdicts.restore(store, mutants) == 1
    restored = json.loads((mutants / "pkg" / "mod.py.meta").read_text())["exit_code_by_key"]
    assert restored == {**codes, "pkg.mod.xǁCǁg__mutmut_1": 1}


def test_restore_keeps_local_rechecks_first(verdicts, tmp_path):
    mutants = tmp_path / "mutants"
    _tree(mutants)
    stored = {"status": "survived", "hash": "old", "detail": ""}
    jax = {"status": "killed", "hash": "hf", "detail": ""}
    rechecks = {"pkg.mod.x_f__mutmut_2": {"tensorflow": stored, "jax": jax}}
    store = tmp_path / "store.json"
    store.write_text(json.dumps({"files": {}, "rechecks": rechecks}))
    verdicts.restore(store, mutants)
    merged = json.loads((mutants / "backend-verdicts.json").read_text())["pkg.mod.x_f__mutmut_2"]
    assert merged["tensorflow"]["hash"] == "hf"  # the local recheck
    assert merged["jax"] == jax


def test_the_command_line_round_trip(verdicts, tmp_path, capsys):
    _tree(tmp_path / "mutants")
    store = str(tmp_path / "store.json")
    assert verdicts.main(["save", str(tmp_path / "mutants"), store]) == 0
    assert verdicts.main(["restore", store, str(tmp_path / "fresh")]) == 0
    out = capsys.readouterr().out
    assert f"3 verdicts saved to {store}" in out and f"3 verdicts restored from {store}" in out


def test_the_view_takes_local_meta_files_first_and_the_store_for_the_rest(verdicts, tmp_path):
    mutants = tmp_path / "mutants"
    codes = _tree(mutants)
    other = {
        "hash_by_function_name": {"x_h": "hh"},
        "exit_code_by_key": {"pkg.other.x_h__mutmut_1": 1},
    }
    stale = {"hash_by_function_name": {"x_f": "old"}, "exit_code_by_key": {}}
    jax = {"status": "killed", "hash": "hf", "detail": ""}
    stored_tf = {"status": "survived", "hash": "old", "detail": ""}
    store = tmp_path / "store.json"
    store.write_text(
        json.dumps(
            {
                "files": {"pkg/other.py": other, "pkg/mod.py": stale},
                "rechecks": {"pkg.mod.x_f__mutmut_2": {"jax": jax, "tensorflow": stored_tf}},
            }
        )
    )
    before = {path: path.read_bytes() for path in mutants.rglob("*") if path.is_file()}
    files, rechecks = verdicts.view(mutants, store)
    assert files["pkg/other.py"] == other
    assert files["pkg/mod.py"]["exit_code_by_key"] == codes
    assert rechecks["pkg.mod.x_f__mutmut_2"]["jax"] == jax
    assert rechecks["pkg.mod.x_f__mutmut_2"]["tensorflow"]["hash"] == "hf"
    # Read only: nothing under mutants/ is touched, nothing is added.
    assert {path: path.read_bytes() for path in mutants.rglob("*") if path.is_file()} == before


def test_every_test_module_of_the_application_is_selected_for_its_mutants():
    """A new test file of the application that the mutation run leaves out would let its
    mutants survive unseen: each one is in the selection or named as not selected."""
    import re

    root = _PATH.parent.parent
    config = (root / "scripts" / "mutation-app.cfg").read_text()
    selection = config.split("pytest_add_cli_args_test_selection =", 1)[1]
    selected = set(re.findall(r"^\s+(tests/test_\w+\.py)$", selection, re.M))
    unselected = set(re.findall(r"^# not selected: (tests/test_\w+\.py)  \S", config, re.M))
    assert unselected and not selected & unselected
    imports = re.compile(r"^\s*(from|import) (training|serving|apputil|benchmarks)\b", re.M)
    application = {
        f"tests/{path.name}"
        for path in (root / "tests").glob("test_*.py")
        if imports.search(path.read_text())
    }
    assert application - selected - unselected == set()
    assert all((root / name).is_file() for name in selected | unselected)


def test_every_module_of_the_application_is_mutated_or_named_with_why_not():
    """A new module the mutation configuration forgets is never judged: each one is a
    `# module:` of it or a `# not mutated:` with its reason."""
    import re

    root = _PATH.parent.parent
    config = (root / "scripts" / "mutation-app.cfg").read_text()
    mutated = set(re.findall(r"^# module: ([\w.]+)", config, re.M))
    unmutated = set(re.findall(r"^# not mutated: ([\w.]+)  \S", config, re.M))
    assert unmutated and not mutated & unmutated
    modules = {
        ".".join(path.relative_to(root).with_suffix("").parts)
        for package in ("training", "serving", "apputil", "benchmarks")
        for path in (root / package).rglob("*.py")
        if path.name != "__init__.py"
    }
    assert modules - mutated - unmutated == set()
    assert (mutated | unmutated) - modules == set()


def _backends():
    spec = importlib.util.spec_from_file_location(
        "mutation_backends", _PATH.parent / "mutation_backends.py"
    )
    backends = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backends)
    return backends


def test_a_recheck_leaves_out_mutants_of_modules_the_tree_holds_only_as_copies():
    """After a run over other modules, a module's file in the tree has no mutants to switch
    on: every test would pass, and its kills would be recorded as survivors."""
    backends = _backends()
    mutants = ["pkg.mod.x_f__mutmut_1", "pkg.mod.xǁCǁm__mutmut_2", "pkg.other.x_g__mutmut_3",
               "pkg.other.x_g__mutmut_4"]  # fmt: skip
    hashes = {"pkg.mod.x_f": "a1", "pkg.mod.xǁCǁm": "b2"}  # the last run mutated pkg.mod
    assert backends._in_tree(mutants, hashes) == (mutants[:2], ["pkg.other"])
    assert backends._in_tree(mutants, {}) == ([], ["pkg.mod", "pkg.other"])


@pytest.fixture
def pending(verdicts, monkeypatch):
    """scripts/mutation_pending.py as a module."""
    import sys

    monkeypatch.setitem(sys.modules, "mutation_verdicts", verdicts)  # mutation_pending's
    spec = importlib.util.spec_from_file_location(
        "mutation_pending", _PATH.parent / "mutation_pending.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_pass_kills_and_listed_equivalents_are_checked_and_the_rest_pending(pending):
    """A mutant mutmut never ran counts as checked once a recheck killed it while its
    function is unchanged, or once it is listed as equivalent; else it stays pending."""
    names = [f"pkg.mod.x_f__mutmut_{i}" for i in range(1, 7)]
    codes = dict(zip(names, (1, 0, None, None, None, None), strict=True))
    files = {"pkg/mod.py": _meta(codes, {"x_f": "h1"})}
    rechecks = {
        names[1]: {"tensorflow": {"status": "killed", "hash": "h1", "detail": ""}},
        names[2]: {"tensorflow": {"status": "killed", "hash": "h1", "detail": ""}},
        names[3]: {"tensorflow": {"status": "killed", "hash": "old", "detail": ""}},  # stale
    }
    equivalents = f"# comment\n{names[4]}  the reason\n"
    config = "# module: pkg.mod\n"
    assert list(pending.pending(config, files, rechecks, equivalents)) == [names[3], names[5]]
    row = pending.table(config, files, rechecks, equivalents).splitlines()[-1]
    # mutants, checked, killed by the run, killed by a recheck, equivalent, left, score
    assert row == "| `pkg.mod` | full | 6 | 4 | 1 | 2 | 1 | 0 | 100.0% |"


def test_a_sample_judges_a_full_module_on_the_draw_of_mutation_sh(pending):
    """`--sample N` judges every module, a full one too, on the seeded draw that
    `MUTATION_SAMPLE=N scripts/mutation.sh` runs; named modules keep only those."""
    names = [f"pkg.mod.x_f__mutmut_{i}" for i in range(1, 11)]
    codes = dict.fromkeys(names)
    codes[names[0]] = 1  # killed by the run
    files = {"pkg/mod.py": _meta(codes, {"x_f": "h1"}), "pkg/other.py": _meta(
        {"pkg.other.x_g__mutmut_1": None}, {"x_g": "h2"})}  # fmt: skip
    config = "# module: pkg.mod\n# module: pkg.other  # sample: 40\n"
    draw = random.Random("keras-antisym:pkg.mod").sample(sorted(names), 4)
    expected = [name for name in draw if name != names[0]]
    assert list(pending.pending(config, files, sample=4, only=("pkg.mod",))) == expected
    assert list(pending.pending(config, files, only=("pkg.other",))) == [
        "pkg.other.x_g__mutmut_1"
    ]
    assert len(list(pending.pending(config, files))) == 10  # full, and the other's one
    row = pending.table(config, files, {}, "", sample=4, only=("pkg.mod",)).splitlines()
    checked = 1 if names[0] in draw else 0
    assert row[2:] == [
        f"| `pkg.mod` | sample | 10 | {checked} | {checked} | 0 | 0 | 0 | "
        f"{'100.0%' if checked else '-'} |"
    ]
    with pytest.raises(ValueError, match="pkg.nothing"):
        list(pending.pending(config, files, only=("pkg.nothing",)))


@pytest.mark.parametrize("argv, words", [
    (["--sample", "0"], "argument `--sample`, expected a positive integer, got '0'."),
    (["--sample", "x"], "argument `--sample`, expected a positive integer, got 'x'."),
    (["pkg.nothing"], "argument `modules`, expected modules of scripts/mutation-app.cfg, "
                      "got pkg.nothing."),
])  # fmt: skip
def test_the_command_line_refuses_a_bad_sample_or_module(pending, capsys, argv, words):
    with pytest.raises(SystemExit):
        pending.main(argv)
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"Received an invalid value for {words}"
    )


# A tree's test for the mutants below: mutant 1 of `x_f` breaks it; the two mutants of `x_g`
# each wait for the other's child to have started (so they pass only when run at once).
_TREE_TEST = '''
import os, pathlib, time
MUTANT = os.environ["MUTANT_UNDER_TEST"]

def test_f():
    assert MUTANT != "pkg.mod.x_f__mutmut_1"

def test_s():
    time.sleep(120)  # a mutant whose tests run long

def test_h():
    import signal, threading
    signal.alarm(0)  # as a test plugin that re-arms SIGALRM does
    # A thread that is no daemon: the child's interpreter never exits after its tests.
    threading.Thread(target=time.sleep, args=(3600,)).start()

def test_k():
    import signal, threading
    signal.alarm(0)
    threading.Thread(target=time.sleep, args=(3600,)).start()  # no daemon: the exit hangs
    assert MUTANT != "pkg.mod.x_k__mutmut_1"

import pytest

@pytest.fixture
def hangs_at_teardown():
    import signal
    signal.alarm(0)
    yield
    time.sleep(3600)  # a server left without its workers waits for them

def test_d(hangs_at_teardown):
    assert MUTANT != "pkg.mod.x_d__mutmut_1"

def test_g_together():
    if not MUTANT.startswith("pkg.mod.x_g"):
        return
    pathlib.Path(MUTANT).touch()
    other = {"pkg.mod.x_g__mutmut_1": "pkg.mod.x_g__mutmut_2"}.get(MUTANT, "pkg.mod.x_g__mutmut_1")
    deadline = time.monotonic() + 60
    while not pathlib.Path(other).exists():
        assert time.monotonic() < deadline, "the other mutant's child never ran beside this one"
        time.sleep(0.05)
'''


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """`(mutation_backends, children)`: the runner in a tree of `_TREE_TEST`, its children
    counted (`children["most"]` at once, `children["pids"]` all), their output files in
    `children["logs"]`."""
    backends = _backends()
    (tmp_path / "mutmut_keras_compat.py").write_text("")  # the plugin every child loads
    (tmp_path / "test_tree.py").write_text(_TREE_TEST)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))  # the children's output files
    children = {"live": set(), "most": 0, "pids": [], "logs": logs}
    start, outcome = backends._start_pytest, backends._outcome

    def counted_start(*args, **kwargs):
        pid, output = start(*args, **kwargs)
        children["live"].add(output)
        children["pids"].append(pid)
        children["most"] = max(children["most"], len(children["live"]))
        return pid, output

    def counted_outcome(status, output, report=None):
        children["live"].discard(output)
        return outcome(status, output, report)

    monkeypatch.setattr(backends, "_start_pytest", counted_start)
    monkeypatch.setattr(backends, "_outcome", counted_outcome)
    return backends, children


_TREE_TESTS = {
    "pkg.mod.x_f": ["test_tree.py::test_f"],
    "pkg.mod.x_g": ["test_tree.py::test_g_together"],
    "pkg.mod.x_s": ["test_tree.py::test_s"],
    "pkg.mod.x_t": ["test_tree.py::test_h"],
    "pkg.mod.x_k": ["test_tree.py::test_k"],
    "pkg.mod.x_d": ["test_tree.py::test_d"],
}


def _check(backends, todo, jobs):
    return backends._check_all(
        todo, lambda m: _TREE_TESTS.get(backends._function(m), []), (), jobs)  # fmt: skip


def test_mutants_are_checked_in_children_up_to_jobs_at_once(tree):
    """Each mutant's verdict comes from its own child with that mutant switched on; with
    `--jobs 2` two children run at once (the two `x_g` mutants each see the other start)."""
    backends, children = tree
    todo = ["pkg.mod.x_f__mutmut_1", "pkg.mod.x_f__mutmut_2", "pkg.mod.x_h__mutmut_1",
            "pkg.mod.x_g__mutmut_1", "pkg.mod.x_g__mutmut_2"]  # fmt: skip
    found = list(_check(backends, todo, 2))
    verdicts = {mutant: status for mutant, status, _ in found}
    assert len(found) == len(todo)
    assert verdicts == {
        "pkg.mod.x_f__mutmut_1": "killed", "pkg.mod.x_f__mutmut_2": "survived",
        "pkg.mod.x_h__mutmut_1": "no tests",
        "pkg.mod.x_g__mutmut_1": "survived", "pkg.mod.x_g__mutmut_2": "survived",
    }  # fmt: skip
    detail = {mutant: d for mutant, _, d in found}["pkg.mod.x_f__mutmut_1"]
    assert detail.startswith("FAILED test_tree.py::test_f")
    assert children["most"] == 2  # at once, and never more
    assert list(children["logs"].iterdir()) == []


def test_a_check_stopped_early_leaves_no_child_running_and_no_output_file(tree):
    """The caller stops after the first verdict (as Ctrl-C or an error would stop it): the
    child still running its mutant's tests is ended and reaped, its output file removed."""
    backends, children = tree
    checks = _check(backends, ["pkg.mod.x_s__mutmut_1", "pkg.mod.x_f__mutmut_1"], 2)
    assert next(checks)[:2] == ("pkg.mod.x_f__mutmut_1", "killed")
    checks.close()
    slow = children["pids"][0]
    with pytest.raises(ChildProcessError):
        os.waitpid(slow, os.WNOHANG)  # reaped already
    assert list(children["logs"].iterdir()) == []


def test_a_child_that_never_exits_is_ended_by_the_parent_as_a_timeout(tree, monkeypatch):
    backends, children = tree
    monkeypatch.setattr(backends, "TIMEOUT_S", 3)
    monkeypatch.setattr(backends, "_GRACE_S", 0)
    started = time.monotonic()
    (found,) = _check(backends, ["pkg.mod.x_t__mutmut_1"], 1)
    assert found[:2] == ("pkg.mod.x_t__mutmut_1", "timeout")
    assert time.monotonic() - started < 60
    with pytest.raises(ChildProcessError):
        os.waitpid(children["pids"][0], os.WNOHANG)  # reaped
    assert list(children["logs"].iterdir()) == []


def test_a_failed_test_whose_child_then_never_exits_is_a_kill(tree, monkeypatch):
    """The mutant failed a test, and a thread it left keeps the child from exiting: the
    parent ends it at the deadline, and the reported failure is the verdict."""
    backends, children = tree
    monkeypatch.setattr(backends, "TIMEOUT_S", 3)
    monkeypatch.setattr(backends, "_GRACE_S", 0)
    (found,) = _check(backends, ["pkg.mod.x_k__mutmut_1"], 1)
    assert found[:2] == ("pkg.mod.x_k__mutmut_1", "killed")
    assert found[2].startswith("FAILED test_tree.py::test_k")
    with pytest.raises(ChildProcessError):
        os.waitpid(children["pids"][0], os.WNOHANG)  # reaped
    assert list(children["logs"].iterdir()) == []


def test_a_failed_test_whose_teardown_never_ends_is_a_kill(tree, monkeypatch):
    """pytest never reaches its summary: the failure it wrote out as it happened is the
    verdict, once the parent has ended the child at its deadline."""
    backends, children = tree
    monkeypatch.setattr(backends, "TIMEOUT_S", 3)
    monkeypatch.setattr(backends, "_GRACE_S", 0)
    (found,) = _check(backends, ["pkg.mod.x_d__mutmut_1"], 1)
    assert found == ("pkg.mod.x_d__mutmut_1", "killed",
                     "FAILED test_tree.py::test_d - its child never finished")  # fmt: skip
    assert list(children["logs"].iterdir()) == []


def test_a_failure_is_named_by_pytest_s_summary_line_not_by_a_logged_error(tmp_path):
    backends = _backends()
    output = tmp_path / "child.log"
    output.write_text(
        "ERROR    serving.local.grpcd:grpcd.py:385 Internal error on gRPC predict\n"
        "FAILED tests/test_x.py::test_y - AssertionError: no\n"
        "ERROR tests/test_x.py::test_z - ValueError\n"
    )
    report = []
    code, first = backends._outcome(1 << 8, str(output), report)  # exit status 1
    assert (code, first) == (1, "FAILED tests/test_x.py::test_y - AssertionError: no")
    assert report == ["tests/test_x.py::test_y", "tests/test_x.py::test_z"]
    assert not output.exists()


def test_jobs_must_be_a_positive_integer(capsys):
    backends = _backends()
    assert backends._parse(["--jobs", "2", "tensorflow", "p.*"]).jobs == 2
    assert backends._parse(["tensorflow", "p.*"]).jobs == 1
    for bad in ("0", "two", "-1", "1.5"):
        with pytest.raises(SystemExit):
            backends._parse([f"--jobs={bad}", "tensorflow", "p.*"])
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            "Received an invalid value for argument `--jobs`, expected a positive integer, "
            f"got '{bad}'."
        )
