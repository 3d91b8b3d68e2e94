"""mutmut's verdicts kept in the repository, so that a run in a fresh clone goes on from them.

mutmut caches each mutant's verdict in `mutants/**/*.py.meta`, beside the hash of
every mutated function, and keeps the verdicts of a function whose hash is
unchanged when it generates the mutants again. `mutants/` is its working copy
of the tree and is not committed; a clone would start from nothing. So
`scripts/mutation.sh` saves the verdicts (and the rechecks of
`mutants/backend-verdicts.json`) to a committed file after each run and
restores them into a `mutants/` that lacks them before the next:

    python scripts/mutation_verdicts.py save mutants dev/mutation-verdicts.json
    python scripts/mutation_verdicts.py restore dev/mutation-verdicts.json mutants

`save` replaces the stored entry of every source file that `mutants/` holds and
keeps the others; an entry lists every mutant (None: not checked yet), so that
`mutation_pending.py` sees what is left after a restore. `restore` writes the
meta file of every stored source file that `mutants/` lacks, which mutmut then
merges as its own (dropping the verdicts of functions changed since); where a
meta file exists it only fills in the verdicts that it lacks of functions with
the same hash. The rechecks are merged per mutant and backend, the local ones
first; their kills count only while the function's hash is the one they were
recorded with (`mutation_backends.py`).
"""

import argparse
import json
import os
import pathlib
import sys

RECHECKS = "backend-verdicts.json"
META_SUFFIX = ".py.meta"


def _function(mutant):
    """The mangled function name of a mutant (`module.xǁClassǁf__mutmut_3` → `xǁClassǁf`)."""
    return mutant.partition("__mutmut_")[0].rpartition(".")[2]


def _read_json(path, default):
    try:
        return json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        return default


def _write_json(path, value):
    """Written whole or not at all (a temporary file renamed), one entry per line."""
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    os.replace(temporary, path)


def _meta_files(mutants):
    """`{source path relative to the tree: meta file}` under `mutants`."""
    mutants = pathlib.Path(mutants)
    return {
        meta.relative_to(mutants).as_posix().removesuffix(".meta"): meta
        for meta in sorted(mutants.rglob("*" + META_SUFFIX))
    }


def view(mutants, store):
    """What `mutants` and the stored file know together, read only (safe beside a run).

    Returns:
        `({source path: {"exit_code_by_key": ..., "hash_by_function_name": ...}},
        {mutant: {backend: recheck}})`: a source file's meta from `mutants` where it
        has one, else the stored entry; the rechecks of both, the local ones first.
    """
    stored = _read_json(store, {"files": {}, "rechecks": {}})
    files = dict(stored["files"])
    for source, meta_path in _meta_files(mutants).items():
        files[source] = json.loads(meta_path.read_text())
    rechecks = dict(stored["rechecks"])
    for mutant, by_backend in _read_json(pathlib.Path(mutants) / RECHECKS, {}).items():
        rechecks[mutant] = {**rechecks.get(mutant, {}), **by_backend}
    return files, rechecks


def save(mutants, store):
    """Stores the mutants, their verdicts (None: not checked yet) and the function hashes
    of every meta file under `mutants`, and the rechecks (`view`'s merge, written back).

    Returns:
        The number of verdicts (checked mutants) in the stored file.
    """
    files, rechecks = view(mutants, store)
    kept = {
        source: {
            "hash_by_function_name": meta.get("hash_by_function_name", {}),
            "exit_code_by_key": meta["exit_code_by_key"],
        }
        for source, meta in files.items()
    }
    _write_json(store, {"files": kept, "rechecks": rechecks})
    return sum(
        code is not None for meta in kept.values() for code in meta["exit_code_by_key"].values()
    )


def restore(store, mutants):
    """Writes the stored verdicts into `mutants` where it lacks them.

    Returns:
        The number of verdicts restored.
    """
    stored = _read_json(store, {"files": {}, "rechecks": {}})
    mutants = pathlib.Path(mutants)
    count = 0
    for source, entry in stored["files"].items():
        meta_path = mutants / (source + ".meta")
        if not meta_path.exists():
            meta_path.parent.mkdir(parents=True, exist_ok=True)
            meta = {
                "exit_code_by_key": dict(entry["exit_code_by_key"]),
                "hash_by_function_name": entry["hash_by_function_name"],
                "type_check_error_by_key": {},
                "durations_by_key": {},
                "estimated_durations_by_key": {},
            }
            _write_json(meta_path, meta)
            count += sum(code is not None for code in entry["exit_code_by_key"].values())
            continue
        meta = json.loads(meta_path.read_text())
        hashes, codes = meta.get("hash_by_function_name", {}), meta["exit_code_by_key"]
        filled = 0
        for mutant, code in entry["exit_code_by_key"].items():
            function = _function(mutant)
            same = hashes.get(function) == entry["hash_by_function_name"].get(function)
            if code is not None and mutant in codes and codes[mutant] is None and same:
                codes[mutant] = code
                filled += 1
        if filled:
            _write_json(meta_path, meta)
            count += filled
    if stored["rechecks"]:
        mutants.mkdir(parents=True, exist_ok=True)
        _write_json(mutants / RECHECKS, view(mutants, store)[1])
    return count


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python scripts/mutation_verdicts.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    saving = commands.add_parser("save", help="mutants/ into the stored file")
    saving.add_argument("mutants")
    saving.add_argument("store")
    restoring = commands.add_parser("restore", help="the stored file into mutants/")
    restoring.add_argument("store")
    restoring.add_argument("mutants")
    args = parser.parse_args(argv)
    if args.command == "save":
        print(f"{save(args.mutants, args.store)} verdicts saved to {args.store}")
    else:
        print(f"{restore(args.store, args.mutants)} verdicts restored from {args.store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
