"""Check mutmut's surviving mutants again on another Keras backend (JAX, PyTorch).

mutmut runs the tests on TensorFlow, in one process; code that only runs on
another backend (the JAX and PyTorch branches of the diagnostics' gradients,
PyTorch's state copies) survives there whatever the tests say. This runs each
given mutant's tests (mutmut's own map, `mutmut tests-for-mutant`) in mutmut's
tree `mutants/` with `KERAS_BACKEND` set and the mutant switched on, as mutmut
does (a child per mutant, stopping at the first failure), and records
the verdicts in `mutants/backend-verdicts.json`, keyed by the backend, with
the mutated function's hash: a kill stands while the function is unchanged,
anything else is checked again at the next call.
`scripts/mutation.sh` adds them to its report.

Tests that fail on this backend without any mutant are left out (a baseline run
first), as are mutants that mutmut killed already.

With `tensorflow` it is the recheck of survivors after new tests were written for
them: `--test PATH` (repeated) adds tests that mutmut's map (collected before they
existed) cannot name (`--only`: runs them alone, without the map's), and the
current `tests/` is copied into the tree first.
The report counts those kills as "recheck". `--app` works in `.mutation-app/`.

`--jobs N` checks N mutants at once, a child each (one per idle core: most tests run on
one core).

`--unchecked` takes the mutants mutmut has not run yet too: with `--only --test`, a
first pass of a module's own fast tests over them, in a fraction of the time mutmut
spends running every test that covers the function. Its kills are recorded like a
recheck's; whatever survives it stays unchecked for mutmut (`mutation_pending.py`
lists it), whose full map then decides.

    scripts/mutation.sh --backend jax 'keras_antisym.diagnostics.x__gradients*'
    python scripts/mutation_backends.py torch 'keras_antisym.layers.*'  # the same
    python scripts/mutation_backends.py --app --test tests/test_tune.py \
        tensorflow 'training.tune.*'

Run it after `scripts/mutation.sh` (it reads mutmut's results and test map), not
beside a mutmut run (it rewrites the tree's tests).
"""

import argparse
import fcntl
import fnmatch
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

VERDICTS = "backend-verdicts.json"
NOT_KILLED = (0, 33)  # mutmut's exit codes for "survived" and "no tests"
TIMEOUT_S = 600
_GRACE_S = 30  # past TIMEOUT_S the parent kills a child its own alarm did not end
_POLL_S = 0.2
_SUMMARY_LINE = re.compile(r"(FAILED|ERROR) \S")


def _mutmut_results():
    """{mutant name: mutmut exit code} from mutants/**/*.meta."""
    codes = {}
    for folder, _, files in os.walk("."):
        for name in files:
            if name.endswith(".py.meta"):
                with open(os.path.join(folder, name)) as f:
                    codes.update(json.load(f)["exit_code_by_key"])
    return codes


def _function(mutant):
    return mutant.rsplit("__mutmut_", 1)[0]


def _record(mutant, backend, verdict):
    """Adds one verdict to the file, keeping what other runs (backends, or a second
    recheck over other patterns) wrote meanwhile: read and replaced under a lock."""
    with open(f"{VERDICTS}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        verdicts = {}
        if os.path.exists(VERDICTS):
            with open(VERDICTS) as f:
                verdicts = json.load(f)
        verdicts.setdefault(mutant, {})[backend] = verdict
        temporary = f"{VERDICTS}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            json.dump(verdicts, f, indent=1, sort_keys=True)
        os.replace(temporary, VERDICTS)


def _killed(verdict, hashes, mutant):
    return (
        bool(verdict)
        and verdict["status"] == "killed"
        and (verdict["hash"] == hashes.get(_function(mutant)))
    )


def _in_tree(mutants, hashes):
    """`(mutants whose function the tree's last mutmut run mutated, modules of the others)`.

    The tree holds mutants only of the modules its last run mutated (`hashes`: that run's
    function hashes); the others' files are plain copies, where MUTANT_UNDER_TEST switches
    nothing on and every test would pass. Those keep their verdicts until a run
    generates them again.
    """
    kept = [m for m in mutants if _function(m) in hashes]
    absent = sorted({m.split(".x", 1)[0] for m in mutants if _function(m) not in hashes})
    return kept, absent


# A child's program: pytest on the arguments given as JSON, stopped by SIGALRM after its
# time limit (a mutant that makes a test loop forever). Each failed test is also written
# out as it fails (`_AT_ONCE`): a mutant may then hang the test's teardown (a server
# left without its workers waits for them), and pytest never reaches its summary.
_AT_ONCE = "failed at once: "
_CHILD = (
    "import json, signal, sys\n"
    "import pytest\n"
    "class AtOnce:\n"
    "    def pytest_runtest_logreport(self, report):\n"
    "        if report.failed:\n"
    # On a line of its own: pytest's progress letters have no newline.
    f"            print({chr(10) + _AT_ONCE!r} + report.nodeid, flush=True)\n"
    "signal.alarm(int(sys.argv[1]))\n"
    "sys.exit(int(pytest.main(json.loads(sys.argv[2]), plugins=[AtOnce()])))\n"
)


def _start_pytest(tests, mutant, report=None, deselect=()):
    """Starts a child Python running pytest on `tests` with `mutant` on, its output into a
    temporary file (not a pipe: several children run at once, and one that fills a pipe
    nobody reads would stall): `(pid, output path)`. A fresh interpreter, not a fork:
    a fork of a process whose threads hold locks (TensorFlow's, a test runner's) can
    deadlock in the child."""
    handle, output = tempfile.mkstemp(prefix="mutant-", suffix=".log")
    args = ["-q", "-p", "mutmut_keras_compat", "-p", "no:cacheprovider"]
    args += ["-p", "no:xdist", "-p", "no:randomly", "--rootdir=.", "-o", "addopts="]
    args += [f"--deselect={test}" for test in deselect]
    args += ["-x"] if report is None else ["-rf", "--tb=no"]
    try:
        # A bare pid, as the caller reaps it with os.wait/os.waitpid.
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-c", _CHILD, str(TIMEOUT_S), json.dumps([*args, *tests])],
            {**os.environ, "MUTANT_UNDER_TEST": mutant},
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                          (os.POSIX_SPAWN_DUP2, handle, 1), (os.POSIX_SPAWN_DUP2, handle, 2)],
        )  # fmt: skip
    finally:
        os.close(handle)
    return pid, output


def _outcome(status, output, report=None):
    """A finished child's `(exit code, first failure)`; its failed tests' ids appended to
    `report` when given. Removes its output file."""
    with open(output) as f:
        lines = f.read().splitlines()
    os.unlink(output)
    # pytest's summary lines ("FAILED tests/x.py::t - ..."), not captured log records,
    # which start "ERROR    module:file.py:12 ...".
    failed = [line for line in lines if _SUMMARY_LINE.match(line)]
    if not failed:
        # No summary: the child was ended after a failure, in a teardown that never ended.
        failed = [
            f"FAILED {line.removeprefix(_AT_ONCE)} - its child never finished"
            for line in lines
            if line.startswith(_AT_ONCE)
        ]
    if report is not None:
        report.extend(line.split()[1] for line in failed)
    # No test ran: pytest (exit code 4) could not import the tests' conftest.
    failed += [line for line in lines if "while loading conftest" in line][:1]
    code = os.waitstatus_to_exitcode(status)
    # Paths as the tree names them (the verdicts are kept in the repository).
    return code, (failed[0].replace(os.getcwd() + os.sep, "")[:200] if failed else "")


def _run_pytest(tests, mutant, report=None, deselect=()):
    """pytest on `tests` in a child with `mutant` on: (exit code, first failure)."""
    pid, output = _start_pytest(tests, mutant, report, deselect)
    _, status = os.waitpid(pid, 0)
    return _outcome(status, output, report)


def _verdict(code, detail):
    """`(status, detail)` of a mutant from its tests' exit code and first failure."""
    status = {0: "survived", 1: "killed"}.get(code, "timeout" if code < 0 else "error")
    if (code == 2 and detail.startswith("ERROR")) or (
        code == 4 and "while loading conftest" in detail
    ):
        # A test module (or the tests' conftest) could not be imported: the mutant broke
        # code it runs at import (a valid configuration it builds is refused, the quiet
        # import of Keras fails), a failure too.
        status = "killed"
    if code < 0 and _SUMMARY_LINE.match(detail):
        # pytest reported a failed test, and only then did the child's exit hang on a
        # thread the mutant left behind (one made no daemon) until its deadline: a kill.
        status = "killed"
    if status == "error":
        detail = f"pytest exit code {code}"
    return status, detail


def _wait_any(running):
    """`(pid, wait status)` of the first child to end; a child past its deadline is killed
    first (a timeout). The parent keeps the time: a child's own alarm is not enough, as a
    test plugin may re-arm SIGALRM, and a mutant can leave a thread that keeps the child's
    interpreter from exiting after its tests."""
    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            return pid, status
        now = time.monotonic()
        for child, (_, _, deadline) in running.items():
            if now > deadline:
                os.kill(child, signal.SIGKILL)
        time.sleep(_POLL_S)


def _check_all(todo, tests_of, deselect, jobs):
    """Runs each mutant of `todo` with `tests_of(mutant)`, up to `jobs` children at once,
    yielding `(mutant, status, detail)` as each ends (in the order they end)."""
    queue = list(todo)
    running = {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                mutant = queue.pop(0)
                tests = tests_of(mutant)
                if not tests:
                    yield mutant, "no tests", ""
                    continue
                pid, output = _start_pytest(tests, mutant, deselect=deselect)
                running[pid] = (mutant, output, time.monotonic() + TIMEOUT_S + _GRACE_S)
            if not running:
                continue
            pid, status = _wait_any(running)
            if pid not in running:
                continue  # a child of someone else in this process
            mutant, output, _ = running.pop(pid)
            yield (mutant, *_verdict(*_outcome(status, output)))
    finally:
        # Stopped early (Ctrl-C, SIGTERM, an error, the caller done): no child goes on
        # beside whatever runs next, and no output file stays behind.
        for pid, (_, output, _) in running.items():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.unlink(output)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", action="store_true", help="the tree of scripts/mutation.sh --app")
    parser.add_argument(
        "--test",
        dest="tests",
        action="append",
        default=[],
        metavar="PATH",
        help="a test (file or node id) run for every mutant too; repeat for more",
    )
    parser.add_argument(
        "--only", action="store_true", help="run the --test ones alone, not mutmut's map"
    )
    parser.add_argument(
        "--unchecked",
        action="store_true",
        help="the mutants mutmut has not run yet too (with --only: a first pass)",
    )
    parser.add_argument(
        "--jobs",
        default="1",
        metavar="N",
        help="mutants checked at once, each in its own child (default 1; one per idle core)",
    )
    parser.add_argument("backend", choices=("jax", "torch", "tensorflow"))
    parser.add_argument("patterns", nargs="+", metavar="MUTANT_PATTERN")
    args = parser.parse_args(argv)
    jobs = args.jobs
    args.jobs = int(jobs) if jobs.isdigit() else 0
    if args.jobs < 1:
        parser.error(
            "Received an invalid value for argument `--jobs`, expected a positive integer, "
            f"got {jobs!r}."
        )
    return args


def main(argv):
    args = _parse(argv)
    backend, patterns = args.backend, args.patterns
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    tree = os.path.join(root, ".mutation-app" if args.app else "", "mutants")
    # The tests as they are now: the new ones are what a recheck is for.
    shutil.copytree(
        os.path.join(root, "tests"),
        os.path.join(tree, "tests"),
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    os.chdir(tree)
    sys.path.insert(0, os.getcwd())
    os.environ["MUTANT_UNDER_TEST"] = ""
    with open("mutmut-stats.json") as f:
        stats = json.load(f)
    tests_by_function = stats["tests_by_mangled_function_name"]
    hashes = stats["function_hashes"]
    codes = _mutmut_results()
    mutants = sorted(
        name
        for name, code in codes.items()
        if (code in NOT_KILLED or (args.unchecked and code is None))
        and any(fnmatch.fnmatchcase(name, p) for p in patterns)
    )
    verdicts = {}
    if os.path.exists(VERDICTS):
        with open(VERDICTS) as f:
            verdicts = json.load(f)
    # A kill stands while the function is unchanged; anything else is checked again
    # (the tests may have changed since).
    todo = [m for m in mutants if not _killed(verdicts.get(m, {}).get(backend), hashes, m)]
    todo, absent = _in_tree(todo, hashes)
    if absent:
        print(f"not in this tree (generated by a run over them): {', '.join(absent)}")
    print(f"{len(mutants)} mutants not killed by mutmut match; {len(todo)} to check on {backend}")
    if args.unchecked and args.only:
        # A first pass: a survival here is no verdict (mutmut's map has more tests).
        unrun = {name for name in todo if codes[name] is None}
    else:
        unrun = set()
    if not todo:
        return 0
    # Keras (and its backend) loaded once; each child imports the library itself, so
    # import-time code runs mutated too. TensorFlow is not imported here: Triton
    # (PyTorch) aborts a process in which TensorFlow was imported first.
    import keras  # noqa: F401

    extra = set(args.tests)
    if args.only:
        tests_by_function = {}
    every_test = sorted(extra.union(*(tests_by_function.get(_function(m), ()) for m in todo)))
    failing = []
    _run_pytest(every_test, "", report=failing)
    if failing:
        print(f"left out, failing on {backend} without a mutant: {', '.join(failing)}")

    def tests_of(mutant):
        return sorted((set(tests_by_function.get(_function(mutant), ())) | extra) - set(failing))

    for mutant, status, detail in _check_all(todo, tests_of, failing, args.jobs):
        verdict = {"status": status, "hash": hashes.get(_function(mutant)), "detail": detail}
        print(f"{status:>9}  {mutant}  {detail}", flush=True)
        if mutant in unrun and status != "killed":
            continue
        _record(mutant, backend, verdict)
    # Kept in the repository with mutmut's verdicts (mutants/ is not committed).
    import mutation_verdicts

    store = os.path.join(root, "dev", f"mutation-verdicts{'-app' if args.app else ''}.json")
    print(f"{mutation_verdicts.save('.', store)} verdicts saved to {store}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
