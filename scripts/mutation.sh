#!/usr/bin/env bash
# Mutation testing of keras_antisym/ with mutmut 3 (configured in setup.cfg [mutmut]).
# Not part of CI: every mutant of the library takes hours on two cores (docs/testing.md).
#
#   scripts/mutation.sh                  # every module of keras_antisym/
#   scripts/mutation.sh cells stability  # only these modules' mutants
#   MUTMUT_WORKERS=1 scripts/mutation.sh _validation
#   MUTATION_SAMPLE=30 scripts/mutation.sh  # 30 random mutants per module: a quick estimate
#
# Writes only mutants/ (mutmut's copy of the tree, its cache of verdicts: a second run
# tests only new or changed mutants; delete mutants/ to start over) and the report,
# docs/mutation-report.txt (or $MUTATION_REPORT).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
MUTMUT="${MUTMUT:-.venv/bin/mutmut}"
REPORT="${MUTATION_REPORT:-docs/mutation-report.txt}"
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

mkdir -p mutants
# A pytest plugin (`-p mutmut_keras_compat` in setup.cfg): mutmut wraps every mutated
# function in a `*args, **kwargs` trampoline that sets `__wrapped__`. inspect.signature
# follows it, inspect.getfullargspec does not, and Keras's Operation.__new__ reads
# getfullargspec(cls.__init__).args[0]: every layer constructor would raise IndexError.
# The fork server imports these once (forkserver_warmup = import) and forks a worker per
# mutant. Not keras_antisym or the tests: with those (or the default `pytest --collect-only`
# warm-up) in the fork server, the workers deadlock on a lock (futex) until their timeout.
printf "%s\n" numpy tensorflow keras >mutants/mutmut_preload.txt
cat > mutants/mutmut_keras_compat.py <<'PY'
"""Written by scripts/mutation.sh: getfullargspec follows mutmut's trampolines."""

import inspect

_getfullargspec = inspect.getfullargspec


def _unwrapped_getfullargspec(func):
    return _getfullargspec(inspect.unwrap(func))


inspect.getfullargspec = _unwrapped_getfullargspec
PY

modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
    modules=(cells layers stability diagnostics initializers _validation _keras_private)
fi
for i in "${!modules[@]}"; do
    module="${modules[$i]%.py}"
    module="${module#keras_antisym/}"
    modules[$i]="${module#keras_antisym.}"
done

start=$(date +%s)
if [ -z "${MUTATION_SAMPLE:-}" ]; then
    patterns=()
    for module in "${modules[@]}"; do patterns+=("keras_antisym.${module}.*"); done
    "$MUTMUT" run --max-children "${MUTMUT_WORKERS:-2}" "${patterns[@]}" || status=$?
else
    # A seeded uniform sample of MUTATION_SAMPLE mutants per module, one module at a time
    # in the order given; mutants already checked (in mutants/) are not run again. The
    # names come from mutants/*.meta: a first run (e.g. `scripts/mutation.sh _validation`)
    # generates every module's mutants.
    for module in "${modules[@]}"; do
        mapfile -t names < <("$PYTHON" - "$module" "$MUTATION_SAMPLE" <<'PY'
import json, random, sys
module, size = sys.argv[1], int(sys.argv[2])
codes = json.load(open(f"mutants/keras_antisym/{module}.py.meta"))["exit_code_by_key"]
sample = random.Random(f"keras-antisym:{module}").sample(sorted(codes), min(size, len(codes)))
print("\n".join(name for name in sample if codes[name] is None))
PY
        )
        if [ ${#names[@]} -gt 0 ] && [ -n "${names[0]}" ]; then
            "$MUTMUT" run --max-children "${MUTMUT_WORKERS:-2}" "${names[@]}" || status=$?
        fi
    done
fi
elapsed=$(($(date +%s) - start))

# `mutmut results --all true` prints one "    <module>.<mutant>: <status>" line per mutant.
read -r -d '' SUMMARY <<'PY' || true
import collections, sys, time
elapsed, report, modules = int(sys.argv[1]), sys.argv[2], " ".join(sys.argv[3:])
rows = collections.defaultdict(collections.Counter)
survivors = []
for line in sys.stdin:
    name, _, status = line.strip().rpartition(": ")
    if not name:
        continue
    # keras_antisym.cells.x_f__mutmut_3, keras_antisym.cells.xǁClassǁmethod__mutmut_3
    module = name.split(".x", 1)[0]
    rows[module][status] += 1
    if status not in ("killed", "timeout", "not checked"):
        survivors.append(f"  {status:>12}  {name}")
columns = ["killed", "timeout", "survived", "no tests", "suspicious", "segfault", "not checked"]
header = f"{'module':<28}{'mutants':>8}" + "".join(f"{c:>12}" for c in columns) + f"{'score':>8}"
lines = [
    f"mutmut report, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
    f"scripts/mutation.sh {modules or '(all modules)'} took {elapsed} s",
    "score = (killed + timeout) / (mutants - not checked); the counts cover every mutant",
    "in mutants/ (verdicts are cached across runs; 'not checked' were never run).",
    "",
    header,
]
total = collections.Counter()
for counts in rows.values():
    total.update(counts)
for module, counts in [*sorted(rows.items()), ("TOTAL", total)]:
    generated = sum(counts.values())
    tested = generated - counts["not checked"]
    killed = counts["killed"] + counts["timeout"]
    score = f"{100 * killed / tested:.1f}%" if tested else "-"
    lines.append(
        f"{module:<28}{generated:>8}" + "".join(f"{counts[c]:>12}" for c in columns) + f"{score:>8}"
    )
lines += ["", "Not killed (`mutmut show NAME` prints the diff; docs/testing.md lists equivalents):"]
lines += sorted(survivors) or ["  none"]
with open(report, "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines[: len(rows) + 6]))
print(f"report: {report}")
PY
"$MUTMUT" results --all true | "$PYTHON" -c "$SUMMARY" "$elapsed" "$REPORT" "$@" \
    ${MUTATION_SAMPLE:+"(sample of ${MUTATION_SAMPLE} per module)"}
exit "${status:-0}"
