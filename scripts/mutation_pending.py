"""The application's mutants not yet checked, one name per line, for MUTATION_NAMES_FILE.

    python scripts/mutation_pending.py >pending.txt
    MUTATION_NAMES_FILE=pending.txt scripts/mutation.sh --app

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


def pending(config_text, meta_dir):
    """Yields the names still to check, module by module as the configuration lists them."""
    modules = re.findall(r"^# module: (\S+)(?:\s+# sample: (\d+))?$", config_text, re.M)
    for module, sample in modules:
        meta = meta_dir / f"{module.replace('.', '/')}.py.meta"
        if not meta.exists():
            # A module added to the configuration since the last run: that run's
            # successor generates its mutants (then this lists them).
            print(f"{module}: no mutants generated yet", file=sys.stderr)
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        names = sorted(codes)
        if sample:
            names = random.Random(f"keras-antisym:{module}").sample(
                names, min(int(sample), len(names))
            )
        yield from (name for name in names if codes[name] is None)


def main(argv):
    config_text = (ROOT / "scripts" / "mutation-app.cfg").read_text()
    for name in pending(config_text, ROOT / ".mutation-app" / "mutants"):
        print(name)


if __name__ == "__main__":
    main(sys.argv[1:])
