"""The application's mutants not yet checked, one name per line, for MUTATION_NAMES_FILE.

    python scripts/mutation_pending.py >pending.txt
    MUTATION_NAMES_FILE=pending.txt scripts/mutation.sh --app
    python scripts/mutation_pending.py --table  # the state, per module (dev/testing.md)

Every unchecked mutant of a module run in full, and the unchecked part of the seeded sample
of the modules marked `# sample: N` in scripts/mutation-app.cfg (the same sample as
`MUTATION_SAMPLE=N scripts/mutation.sh --app MODULE` draws). One mutmut run for all of them
collects the test map once; mutmut runs the fastest mutants first.
"""

import pathlib
import random
import re
import sys

import mutation_verdicts

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _modules(config_text):
    """`[(module, sample size or None)]` in the configuration's order."""
    found = re.findall(r"^# module: (\S+)(?:\s+# sample: (\d+))?$", config_text, re.M)
    return [(module, int(sample) if sample else None) for module, sample in found]


def _selected(codes, module, sample):
    """The names a module is judged on: all of them, or its seeded sample."""
    names = sorted(codes)
    if sample:
        names = random.Random(f"keras-antisym:{module}").sample(names, min(sample, len(names)))
    return names


def _source(module):
    return module.replace(".", "/") + ".py"


def _hashes(files):
    """`{qualified function name: hash}`, as mutmut-stats.json's function_hashes."""
    return {
        f"{source.removesuffix('.py').replace('/', '.')}.{function}": digest
        for source, meta in files.items()
        for function, digest in meta.get("hash_by_function_name", {}).items()
    }


def _rechecked(rechecks, hashes):
    """Whether a mutant was killed by `mutation_backends.py tensorflow` (a recheck with
    newer tests, or a first pass over mutants mutmut has not run) while its function is
    unchanged."""

    def rechecked(name):
        verdict = rechecks.get(name, {}).get("tensorflow")
        function = name.rsplit("__mutmut_", 1)[0]
        return (
            bool(verdict)
            and verdict["status"] == "killed"
            and (verdict["hash"] == hashes.get(function))
        )

    return rechecked


def _equivalents(equivalents_text):
    return {line.split()[0] for line in equivalents_text.splitlines()
            if line.strip() and not line.startswith("#")}  # fmt: skip


def pending(config_text, files, rechecks=None, equivalents_text=""):
    """Yields the names still to check, module by module as the configuration lists them:
    neither run by mutmut nor killed by a recheck nor listed as equivalent.

    `files`, `rechecks`: as `mutation_verdicts.view` returns them.
    """
    rechecked = _rechecked(rechecks or {}, _hashes(files))
    equivalent = _equivalents(equivalents_text)
    for module, sample in _modules(config_text):
        if _source(module) not in files:
            # A module added to the configuration since the last run: that run's
            # successor generates its mutants (then this lists them).
            print(f"{module}: no mutants generated yet", file=sys.stderr)
            continue
        codes = files[_source(module)]["exit_code_by_key"]
        yield from (
            name
            for name in _selected(codes, module, sample)
            if codes[name] is None and not rechecked(name) and name not in equivalent
        )


KILLED = {1, 3, -24, 24, 152, 255, 36}  # mutmut's exit codes for killed and timeout


def table(config_text, files, rechecks, equivalents_text):
    """The Markdown table of dev/testing.md: per module, mutmut's verdicts, the kills of
    the rechecks with newer tests (`mutation_backends.py tensorflow`, while the mutated
    function is unchanged), the listed equivalents, and what is left.

    `files`, `rechecks`: as `mutation_verdicts.view` returns them.
    """
    equivalent = _equivalents(equivalents_text)
    rechecked = _rechecked(rechecks, _hashes(files))

    lines = [
        "| module | kind | mutants | checked | killed by the run | killed by a recheck"
        " | equivalent | left | score (w/o eq.) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for module, sample in _modules(config_text):
        kind = "sample" if sample else "full"
        if _source(module) not in files:
            lines.append(f"| `{module}` | {kind} | - | 0 | 0 | 0 | 0 | 0 | - |")
            continue
        codes = files[_source(module)]["exit_code_by_key"]
        names = [
            n
            for n in _selected(codes, module, sample)
            if codes[n] is not None or rechecked(n) or n in equivalent
        ]
        run = sum(codes[n] in KILLED for n in names)
        rest = [n for n in names if codes[n] not in KILLED]
        new = sum(rechecked(n) for n in rest)
        eq = sum(n in equivalent and not rechecked(n) for n in rest)
        left = len(rest) - new - eq
        judged = len(names) - eq
        score = f"{100 * (run + new) / judged:.1f}%" if judged else "-"
        lines.append(
            f"| `{module}` | {kind} | {len(codes)} | {len(names)} | {run} | {new} | {eq} "
            f"| {left} | {score} |"
        )
    return "\n".join(lines)


def main(argv):
    config_text = (ROOT / "scripts" / "mutation-app.cfg").read_text()
    # The last run's mutants/ and, for what it lacks (a fresh clone), the committed verdicts.
    files, rechecks = mutation_verdicts.view(
        ROOT / ".mutation-app" / "mutants", ROOT / "dev" / "mutation-verdicts-app.json"
    )
    equivalents = (ROOT / "dev" / "mutation-equivalents.txt").read_text()
    if argv == ["--table"]:
        print(table(config_text, files, rechecks, equivalents))
        return
    for name in pending(config_text, files, rechecks, equivalents):
        print(name)


if __name__ == "__main__":
    main(sys.argv[1:])
