"""The application's mutants not yet checked, one name per line, for MUTATION_NAMES_FILE.

    python scripts/mutation_pending.py >pending.txt
    MUTATION_NAMES_FILE=pending.txt scripts/mutation.sh --app
    python scripts/mutation_pending.py --table  # the state, per module (dev/testing.md)
    python scripts/mutation_pending.py --sample 40 --table serving.local.rest  # an estimate

Every unchecked mutant of a module run in full, and the unchecked part of the seeded sample
of the modules marked `# sample: N` in scripts/mutation-app.cfg (the same sample as
`MUTATION_SAMPLE=N scripts/mutation.sh --app MODULE` draws). One mutmut run for all of them
collects the test map once; mutmut runs the fastest mutants first. `--sample N` judges
every module, those run in full too, on its seeded sample of N: a score estimate for code
that changed since its last full run, at a fraction of the run; module names after the
options keep only those modules.
"""

import argparse
import pathlib
import random
import re
import sys

import mutation_verdicts

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _modules(config_text, sample=None, only=()):
    """`[(module, sample size or None)]` in the configuration's order: `sample` for every
    module when given, and only the modules of `only` when it names any."""
    found = re.findall(r"^# module: (\S+)(?:\s+# sample: (\d+))?$", config_text, re.M)
    unknown = sorted(set(only) - {module for module, _ in found})
    if unknown:
        raise ValueError(", ".join(unknown))
    return [
        (module, sample or (int(size) if size else None))
        for module, size in found
        if not only or module in only
    ]


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


def pending(config_text, files, rechecks=None, equivalents_text="", sample=None, only=()):
    """Yields the names still to check, module by module as the configuration lists them:
    neither run by mutmut nor killed by a recheck nor listed as equivalent.

    `files`, `rechecks`: as `mutation_verdicts.view` returns them. `sample`: every module's
    seeded sample of that size instead of the configuration's kinds; `only`: these modules.
    """
    rechecked = _rechecked(rechecks or {}, _hashes(files))
    equivalent = _equivalents(equivalents_text)
    for module, size in _modules(config_text, sample, only):
        if _source(module) not in files:
            # A module added to the configuration since the last run: that run's
            # successor generates its mutants (then this lists them).
            print(f"{module}: no mutants generated yet", file=sys.stderr)
            continue
        codes = files[_source(module)]["exit_code_by_key"]
        yield from (
            name
            for name in _selected(codes, module, size)
            if codes[name] is None and not rechecked(name) and name not in equivalent
        )


KILLED = {1, 3, -24, 24, 152, 255, 36}  # mutmut's exit codes for killed and timeout


def table(config_text, files, rechecks, equivalents_text, sample=None, only=()):
    """The Markdown table of dev/testing.md: per module, mutmut's verdicts, the kills of
    the rechecks with newer tests (`mutation_backends.py tensorflow`, while the mutated
    function is unchanged), the listed equivalents, and what is left.

    `files`, `rechecks`: as `mutation_verdicts.view` returns them; `sample`, `only`: as
    for `pending`.
    """
    equivalent = _equivalents(equivalents_text)
    rechecked = _rechecked(rechecks, _hashes(files))

    lines = [
        "| module | kind | mutants | checked | killed by the run | killed by a recheck"
        " | equivalent | left | score (w/o eq.) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for module, size in _modules(config_text, sample, only):
        kind = "sample" if size else "full"
        if _source(module) not in files:
            lines.append(f"| `{module}` | {kind} | - | 0 | 0 | 0 | 0 | 0 | - |")
            continue
        codes = files[_source(module)]["exit_code_by_key"]
        names = [
            n
            for n in _selected(codes, module, size)
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="the state per module, as Markdown")
    parser.add_argument("--sample", metavar="N",
                        help="judge every module on its seeded sample of N mutants")
    parser.add_argument("modules", nargs="*", help="only these modules (default: all)")
    args = parser.parse_args(argv)
    size = args.sample
    if size is not None and not (size.isdigit() and int(size) > 0):
        parser.error(
            "Received an invalid value for argument `--sample`, expected a positive integer, "
            f"got {size!r}."
        )
    config_text = (ROOT / "scripts" / "mutation-app.cfg").read_text()
    # The last run's mutants/ and, for what it lacks (a fresh clone), the committed verdicts.
    files, rechecks = mutation_verdicts.view(
        ROOT / ".mutation-app" / "mutants", ROOT / "dev" / "mutation-verdicts-app.json"
    )
    equivalents = (ROOT / "dev" / "mutation-equivalents.txt").read_text()
    selection = {"sample": size and int(size), "only": tuple(args.modules)}
    try:
        if args.table:
            print(table(config_text, files, rechecks, equivalents, **selection))
            return
        for name in pending(config_text, files, rechecks, equivalents, **selection):
            print(name)
    except ValueError as error:
        parser.error(
            f"Received an invalid value for argument `modules`, expected modules of "
            f"scripts/mutation-app.cfg, got {error}."
        )


if __name__ == "__main__":
    main(sys.argv[1:])
