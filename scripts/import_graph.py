"""Import structure of the application packages, read from their source (nothing imported).

    python scripts/import_graph.py [PACKAGE ...]

Prints, per package, its modules, the imports of the project's own modules made inside
functions, and every import cycle among the project's modules (module-level and
function-local imports both count: a cycle kept working by a deferred import is still
a cycle). Exit status 1 when there is a cycle.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("apputil", "training", "serving", "benchmarks", "keras_antisym")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # `from training import files` imports training.files when that is a module.
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def scan(packages: tuple[str, ...]) -> tuple[dict, dict]:
    """Edges module -> project modules it imports, and the function-local ones per module."""
    modules = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules[module_name(path)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    local: dict[str, list[str]] = {name: [] for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        functions = [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        in_function = {id(n) for f in functions for n in ast.walk(f) if n is not f}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = [t for t in imported_names(node, name, is_package) if t in modules]
            # Importing a.b.c runs a and a.b first.
            closure = set()
            for target in targets:
                parts = target.split(".")
                closure.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            # A module's own ancestor packages are already being imported when it runs.
            ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
            closure = {t for t in closure if t in modules and t != name and t not in ancestors}
            edges[name] |= closure
            if targets and id(node) in in_function:
                local[name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return edges, local


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", default=None)
    parser.add_argument("--verbose", action="store_true", help="list each function-local import")
    args = parser.parse_args(argv)
    packages = tuple(p for p in (args.packages or PACKAGES) if (ROOT / p).is_dir())
    edges, local = scan(packages)
    for package in packages:
        names = [n for n in edges if n == package or n.startswith(package + ".")]
        count = sum(len(local[n]) for n in names)
        print(f"{package}: {len(names)} modules, {count} function-local project imports")
        if args.verbose:
            for n in names:
                for where in local[n]:
                    print(f"  {where}")
    found = cycles(edges)
    print(f"import cycles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
