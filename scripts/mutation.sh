#!/usr/bin/env bash
# Mutation testing with mutmut 3. Not part of CI: every mutant of the library takes
# about two hours on two cores (dev/testing.md).
#
#   scripts/mutation.sh                  # every module of keras_antisym/ (setup.cfg [mutmut]);
#                                        # mutants with a cached verdict are not run again
#   scripts/mutation.sh cells stability  # only these modules' mutants, all re-checked
#   scripts/mutation.sh --app            # every application module listed in
#                                        # scripts/mutation-app.cfg (in .mutation-app/)
#   MUTATION_SAMPLE=40 scripts/mutation.sh --app serving.names training.run.schedules
#   MUTMUT_WORKERS=1 scripts/mutation.sh _validation
#   MUTATION_SAMPLE=30 scripts/mutation.sh  # 30 random mutants per module: a quick estimate
#   python scripts/mutation_pending.py >pending.txt  # what is left to check
#   MUTATION_NAMES_FILE=$PWD/pending.txt scripts/mutation.sh --app
#   MUTATION_NAMES="NAME ..." scripts/mutation.sh --app serving.local.payload
#                                        # these mutants again (e.g. survivors, after new tests)
#   scripts/mutation.sh --backend jax 'keras_antisym.diagnostics.x__gradients*'
#                                        # survivors checked again on JAX (or torch):
#                                        # scripts/mutation_backends.py
#
# Writes only mutants/ (mutmut's copy of the tree, its cache of verdicts: a second run
# tests only new or changed mutants), .mutation-app/ (the same for --app), the report,
# dev/mutation-report.txt (dev/mutation-report-app.txt for --app; or $MUTATION_REPORT),
# and the verdicts kept in the repository, dev/mutation-verdicts.json
# (dev/mutation-verdicts-app.json), restored into a fresh mutants/ before each run
# (scripts/mutation_verdicts.py). Delete mutants/ and that file to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
MUTMUT="${MUTMUT:-$ROOT/.venv/bin/mutmut}"
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

backend=""
if [ "${1:-}" = "--backend" ]; then
    backend="${2:?--backend needs jax, torch or tensorflow, then mutant patterns}"
    shift 2
    backend_patterns=("$@")
    set --
    if [ "${backend_patterns[0]:-}" = "--app" ]; then
        set -- --app  # the recheck reads the tree as the last run left it
    fi
fi
if [ "${1:-}" = "--app" ]; then
    shift
    # The application modules have their own configuration (other files mutated, other
    # tests): mutmut reads it from setup.cfg, and a change of its test selection would
    # drop every cached verdict of the library, so they run in a copy of the tree.
    REPORT="${MUTATION_REPORT:-dev/mutation-report-app.txt}"
    STORE=dev/mutation-verdicts-app.json
    modules=("$@")
    if [ ${#modules[@]} -eq 0 ]; then
        # Every module of the application where a number, a file or a request is handled.
        mapfile -t modules < <(sed -n 's/^# module: \([^ ]*\).*/\1/p' scripts/mutation-app.cfg)
    fi
    if [ -z "$backend" ]; then
        mkdir -p .mutation-app
        for path in apputil keras_antisym training serving benchmarks scripts tests docs dev; do
            rm -rf ".mutation-app/$path"
            cp -r "$path" ".mutation-app/$path"
        done
        cp pyproject.toml .mutation-app/
        # setup.cfg with its [mutmut] section (the last one) replaced by the app's, whose
        # only_mutate is the modules asked for (verdicts of the others stay cached).
        sed '/^\[mutmut\]/,$d' setup.cfg >.mutation-app/setup.cfg
        {
            grep -v '^# module: ' scripts/mutation-app.cfg
            echo "only_mutate ="
            for module in "${modules[@]}"; do echo "    ${module//.//}.py"; done
        } >>.mutation-app/setup.cfg
    fi
    [[ "$REPORT" = /* ]] || REPORT="$ROOT/$REPORT"
    cd .mutation-app
else
    REPORT="${MUTATION_REPORT:-dev/mutation-report.txt}"
    STORE=dev/mutation-verdicts.json
    modules=("$@")
    if [ ${#modules[@]} -eq 0 ]; then
        modules=(cells layers stability diagnostics initializers _validation _keras_private
                 _tf_loop _docstrings)
    fi
    for i in "${!modules[@]}"; do
        module="${modules[$i]%.py}"
        module="${module#keras_antisym/}"
        modules[$i]="keras_antisym.${module#keras_antisym.}"
    done
    [[ "$REPORT" = /* ]] || REPORT="$ROOT/$REPORT"
fi

mkdir -p mutants
# The verdicts of earlier runs, committed (mutants/ is not): a fresh clone goes on from them.
STORE="$ROOT/$STORE"
"$PYTHON" "$ROOT/scripts/mutation_verdicts.py" restore "$STORE" mutants
# mutmut maps tests to functions once, then updates the map only for what it sees changed;
# after a change of the sources or the tests it has been seen to keep a map of a few
# functions, and every mutant outside it then "survives" untested. So the map is collected
# again whole whenever a Python file or setup.cfg changed since the last run.
tree_hash=$(find . -name '*.py' -not -path './mutants/*' -not -path './.*' -print0 |
    sort -z | xargs -0 cat setup.cfg | sha256sum | cut -c1-64)
if [ "$(cat mutants/.tree-hash 2>/dev/null)" != "$tree_hash" ]; then
    rm -f mutants/mutmut-stats.json
fi
echo "$tree_hash" >mutants/.tree-hash
# A pytest plugin (`-p mutmut_keras_compat` in setup.cfg) that runs tests fastest first
# and undoes a clash: mutmut wraps every mutated
# function in a `*args, **kwargs` trampoline that sets `__wrapped__`. inspect.signature
# follows it, inspect.getfullargspec does not, and Keras's Operation.__new__ reads
# getfullargspec(cls.__init__).args[0]: every layer constructor would raise IndexError.
# The fork server imports these once (forkserver_warmup = import) and forks a worker per
# mutant. Not keras_antisym or the tests: with those (or the default `pytest --collect-only`
# warm-up) in the fork server, the workers deadlock on a lock (futex) until their timeout.
printf "%s\n" numpy tensorflow keras >mutants/mutmut_preload.txt
cat > mutants/mutmut_keras_compat.py <<'PY'
"""Written by scripts/mutation.sh: getfullargspec follows mutmut's trampolines."""

import collections
import importlib
import inspect
import json
import os

_getfullargspec = inspect.getfullargspec


def _unwrapped_getfullargspec(func):
    return _getfullargspec(inspect.unwrap(func))


inspect.getfullargspec = _unwrapped_getfullargspec


def pytest_collection_modifyitems(items):
    # mutmut stops at a mutant's first failing test: run its tests fastest first (by the
    # durations of mutmut's instrumented pass), so most mutants die in the first seconds.
    try:
        with open("mutmut-stats.json") as f:
            durations = json.load(f)["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))


# mutmut's test map gives each function the tests during which it ran. What runs while the
# test modules are collected would go to the first test alone, which rarely checks it: the
# mutated modules' own import-time code (a dataclass's field factories, registries) is run
# first, before collection, and goes to every test; what a test module runs while it is
# collected (parametrize arguments, module constants) goes to that module's tests.
_hits_by_module = {}


def _take_hits():
    from mutmut.state import state

    hits = set(state()._stats)
    state()._stats.clear()
    return hits


def _mutated_modules():
    import configparser

    parsed = configparser.ConfigParser()
    parsed.read(["../setup.cfg", "setup.cfg"])
    paths = parsed.get("mutmut", "only_mutate", fallback="").split()
    if not paths:  # the library: every module of its source folders
        import pathlib

        folders = parsed.get("mutmut", "source_paths", fallback="").split()
        paths = [str(path) for folder in folders for path in pathlib.Path(folder).rglob("*.py")]
    modules = [path.removesuffix(".py").replace("/", ".") for path in paths if path.endswith(".py")]
    return [module.removesuffix(".__init__") for module in modules]


def pytest_sessionstart(session):
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    for module in _mutated_modules():
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the tests that import it fail the same way
            pass
    _hits_by_module[""] = _take_hits()


def pytest_collectstart(collector):
    if os.environ.get("MUTANT_UNDER_TEST") == "stats" and collector.nodeid.endswith(".py"):
        _hits_by_module.setdefault("", set()).update(_take_hits())


def pytest_collectreport(report):
    if os.environ.get("MUTANT_UNDER_TEST") == "stats" and report.nodeid.endswith(".py"):
        _hits_by_module[report.nodeid] = _take_hits()


def pytest_collection_finish(session):
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    from mutmut.state import state

    everyone = _hits_by_module.pop("", set()) | _take_hits()
    tests_by_module = collections.defaultdict(set)
    for item in session.items:
        nodeid = item.nodeid.removeprefix("mutants/")
        tests_by_module[nodeid.split("::")[0]].add(nodeid)
    every_test = set().union(*tests_by_module.values())
    for function in everyone:
        state().tests_by_mangled_function_name[function].update(every_test)
    for module, hits in _hits_by_module.items():
        tests = tests_by_module.get(module.removeprefix("mutants/"), set())
        for function in hits:
            state().tests_by_mangled_function_name[function].update(tests)
PY

start=$(date +%s)
if [ -n "$backend" ]; then
    # Survivors checked again on another backend (code that TensorFlow never runs).
    "$PYTHON" "$ROOT/scripts/mutation_backends.py" "$backend" "${backend_patterns[@]}" ||
        status=$?
elif [ -n "${MUTATION_NAMES_FILE:-}" ]; then
    # A list too long for one variable, one name per line (scripts/mutation_pending.py).
    mapfile -t names <"$MUTATION_NAMES_FILE"
    "$MUTMUT" run --max-children "${MUTMUT_WORKERS:-2}" "${names[@]}" || status=$?
elif [ -n "${MUTATION_NAMES:-}" ]; then
    # These mutants (names or patterns, space-separated) checked again, e.g. a report's
    # survivors after new tests.
    read -r -a names <<<"$MUTATION_NAMES"
    "$MUTMUT" run --max-children "${MUTMUT_WORKERS:-2}" "${names[@]}" || status=$?
elif [ -z "${MUTATION_SAMPLE:-}" ]; then
    # mutmut re-runs every mutant a name pattern matches, but skips the cached ones
    # when given no names: an interrupted full run goes on where it stopped.
    patterns=()
    if [ $# -gt 0 ]; then
        for module in "${modules[@]}"; do patterns+=("${module}.*"); done
    fi
    "$MUTMUT" run --max-children "${MUTMUT_WORKERS:-2}" "${patterns[@]}" || status=$?
else
    # A seeded uniform sample of MUTATION_SAMPLE mutants per module, one module at a time
    # in the order given; mutants already checked (in mutants/) are not run again. The
    # names come from mutants/*.meta: a first run (e.g. `scripts/mutation.sh _validation`)
    # generates every module's mutants.
    for module in "${modules[@]}"; do
        if [ ! -f "mutants/${module//.//}.py.meta" ]; then
            # mutmut generates every mutant (and collects its test map) before it
            # filters by name; a name that matches nothing stops it right there.
            "$MUTMUT" run "${module}.x__generate_only__" >/dev/null 2>&1 || true
        fi
        mapfile -t names < <("$PYTHON" - "$module" "$MUTATION_SAMPLE" <<'PY'
import json, random, sys
module, size = sys.argv[1], int(sys.argv[2])
codes = json.load(open(f"mutants/{module.replace('.', '/')}.py.meta"))["exit_code_by_key"]
seed = f"keras-antisym:{module.removeprefix('keras_antisym.')}"  # app: the dotted name
sample = random.Random(seed).sample(sorted(codes), min(size, len(codes)))
print("\n".join(name for name in sample if codes[name] is None))
PY
        )
        if [ ${#names[@]} -gt 0 ] && [ -n "${names[0]}" ]; then
            "$MUTMUT" run --max-children "${MUTMUT_WORKERS:-2}" "${names[@]}" || status=$?
        fi
    done
fi
if [ -z "$backend" ] && [ ! -f mutants/mutmut-stats.json ]; then
    # Every mutant asked for had its verdict already: the test map (and the functions'
    # hashes that the report and the rechecks read) is still collected for this tree.
    "$MUTMUT" run "${modules[0]}.x__generate_only__" >/dev/null 2>&1 || true
fi
elapsed=$(($(date +%s) - start))
"$PYTHON" "$ROOT/scripts/mutation_verdicts.py" save mutants "$STORE"

# `mutmut results --all true` prints one "    <module>.<mutant>: <status>" line per mutant;
# mutants/backend-verdicts.json (scripts/mutation_backends.py) and the equivalents listed
# in dev/mutation-equivalents.txt complete it.
read -r -d '' SUMMARY <<'PY' || true
import collections, json, os, sys, time
elapsed, report, equivalents_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
modules = " ".join(sys.argv[4:])
hashes, other = {}, {}
if os.path.exists("mutants/backend-verdicts.json"):
    hashes = json.load(open("mutants/mutmut-stats.json"))["function_hashes"]
    other = json.load(open("mutants/backend-verdicts.json"))
equivalent = {}  # name: reason, from lines "NAME  reason"
if os.path.exists(equivalents_file):
    for line in open(equivalents_file):
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.strip().partition(" ")
            equivalent[name] = reason.strip()
rows = collections.defaultdict(collections.Counter)
survivors = []
for line in sys.stdin:
    name, _, status = line.strip().rpartition(": ")
    if not name:
        continue
    if status in ("survived", "no tests"):
        function = name.rsplit("__mutmut_", 1)[0]
        killed_on = sorted(
            backend
            for backend, verdict in other.get(name, {}).items()
            if verdict["status"] == "killed" and verdict["hash"] == hashes.get(function)
        )
        if killed_on:
            # TensorFlow is mutmut's own backend: a kill there is a recheck with newer tests.
            status = "recheck" if "tensorflow" in killed_on else "other backend"
            survivors.append(f"  {'killed on ' + '+'.join(killed_on):>18}  {name}")
        elif name in equivalent:
            status = "equivalent"
            survivors.append(f"  {'equivalent':>18}  {name}  {equivalent[name]}")
    # keras_antisym.cells.x_f__mutmut_3, keras_antisym.cells.xǁClassǁmethod__mutmut_3
    module = name.split(".x", 1)[0]
    rows[module][status] += 1
    if status not in ("killed", "timeout", "not checked", "recheck", "other backend", "equivalent"):
        survivors.append(f"  {status:>18}  {name}")
columns = [
    "killed", "timeout", "recheck", "other backend", "equivalent", "survived", "no tests",
    "suspicious",
    "segfault", "not checked",
]
header = f"{'module':<28}{'mutants':>8}" + "".join(f"{c:>14}" for c in columns)
header += f"{'score':>8}{'w/o eq.':>9}"
lines = [
    f"mutmut report, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
    f"scripts/mutation.sh {modules} took {elapsed} s",
    "score = (killed + timeout + recheck + other backend) / (mutants - not checked); 'w/o eq.'",
    "leaves the equivalent mutants out of the denominator. 'recheck': survived mutmut's run,",
    "killed by the tests written since (scripts/mutation_backends.py tensorflow --test).",
    "'timeout' is also mutmut's name for a",
    "worker that died (exit code 255: the mutated library or its tests failed to import);",
    "'other backend': survived on TensorFlow, killed on JAX or PyTorch by",
    "scripts/mutation_backends.py; 'equivalent': listed in dev/mutation-equivalents.txt.",
    "The counts cover every mutant in mutants/ (verdicts are cached across runs).",
    "",
    header,
]
total = collections.Counter()
for counts in rows.values():
    total.update(counts)
for module, counts in [*sorted(rows.items()), ("TOTAL", total)]:
    generated = sum(counts.values())
    tested = generated - counts["not checked"]
    killed = counts["killed"] + counts["timeout"] + counts["recheck"] + counts["other backend"]
    score = f"{100 * killed / tested:.1f}%" if tested else "-"
    rest = tested - counts["equivalent"]
    without = f"{100 * killed / rest:.1f}%" if rest else "-"
    lines.append(
        f"{module:<28}{generated:>8}" + "".join(f"{counts[c]:>14}" for c in columns)
        + f"{score:>8}{without:>9}"
    )
lines += ["", "Not killed by mutmut's run (`mutmut show NAME` prints the diff):"]
lines += sorted(survivors) or ["  none"]
with open(report, "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines[: len(rows) + 10]))
print(f"report: {report}")
PY
"$MUTMUT" results --all true |
    "$PYTHON" -c "$SUMMARY" "$elapsed" "$REPORT" "$ROOT/dev/mutation-equivalents.txt" \
        "${modules[@]}" ${MUTATION_SAMPLE:+"(sample of ${MUTATION_SAMPLE} per module)"}
exit "${status:-0}"
