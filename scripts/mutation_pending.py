"""The application's mutants not yet checked, one name per line, for MUTATION_NAMES_FILE.

    python scripts/mutation_pending.py >pending.txt
    MUTATION_NAMES_FILE=pending.txt scripts/mutation.sh --app
    python scripts/mutation_pending.py --table  # the state, per module (docs/testing.md)

Every unchecked mutant of a module run in full, and the unchecked part of the seeded sample
of the modules marked `# sample: N` in scripts/mutation-app.cfg (the same sample as
`MUTATION_SAMPLE=N scripts/mutation.sh --app MODULE` draws). One mutmut run for all of them
collects the test map once; mutmut runs the fastest mutants first.
"""

import json
import pathlib
import random
import re
import sys

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


def pending(config_text, meta_dir):
    """Yields the names still to check, module by module as the configuration lists them."""
    for module, sample in _modules(config_text):
        meta = meta_dir / f"{module.replace('.', '/')}.py.meta"
        if not meta.exists():
            # A module added to the configuration since the last run: that run's
            # successor generates its mutants (then this lists them).
            print(f"{module}: no mutants generated yet", file=sys.stderr)
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        yield from (name for name in _selected(codes, module, sample) if codes[name] is None)


KILLED = {1, 3, -24, 24, 152, 255, 36}  # mutmut's exit codes for killed and timeout


def table(config_text, meta_dir, equivalents_text):
    """The Markdown table of docs/testing.md: per module, mutmut's verdicts, the kills of
    the rechecks with newer tests (`mutation_backends.py tensorflow`, while the mutated
    function is unchanged), the listed equivalents, and what is left."""
    equivalent = {line.split()[0] for line in equivalents_text.splitlines()
                  if line.strip() and not line.startswith("#")}  # fmt: skip
    verdicts_path, stats_path = meta_dir / "backend-verdicts.json", meta_dir / "mutmut-stats.json"
    verdicts = json.loads(verdicts_path.read_text()) if verdicts_path.exists() else {}
    hashes = json.loads(stats_path.read_text())["function_hashes"] if verdicts else {}

    def rechecked(name):
        verdict = verdicts.get(name, {}).get("tensorflow")
        function = name.rsplit("__mutmut_", 1)[0]
        return (
            bool(verdict)
            and verdict["status"] == "killed"
            and (verdict["hash"] == hashes.get(function))
        )

    lines = [
        "| module | kind | mutants | checked | killed by the run | killed by the new tests"
        " | equivalent | left | score (w/o eq.) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for module, sample in _modules(config_text):
        meta = meta_dir / f"{module.replace('.', '/')}.py.meta"
        kind = "sample" if sample else "full"
        if not meta.exists():
            lines.append(f"| `{module}` | {kind} | - | 0 | 0 | 0 | 0 | 0 | - |")
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        names = [n for n in _selected(codes, module, sample) if codes[n] is not None]
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
    meta_dir = ROOT / ".mutation-app" / "mutants"
    if argv == ["--table"]:
        equivalents = (ROOT / "docs" / "mutation-equivalents.txt").read_text()
        print(table(config_text, meta_dir, equivalents))
        return
    for name in pending(config_text, meta_dir):
        print(name)


if __name__ == "__main__":
    main(sys.argv[1:])
