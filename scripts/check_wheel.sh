#!/usr/bin/env bash
# The wheel as a user gets it: builds it, checks its metadata (twine), installs it
# alone with JAX in a fresh virtual environment (no TensorFlow, no PyTorch, no
# checkout on the path) and runs README.md's "Example" there, from an empty folder.
#
#   bash scripts/check_wheel.sh
#
# PYTHON (default: the project's .venv, else python3) needs `build` and `twine`
# (the `dev` extra). Exits non-zero on the first failed check.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/check_wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
step() { printf '\n== %s (%ss)\n' "$*" "$((SECONDS - START))"; }
fail() { printf 'check_wheel: FAILED: %s\n' "$*" >&2; exit 1; }
# Nothing of the caller's environment may make the checkout or other packages importable.
unset PYTHONPATH PYTHONHOME
export PYTHONNOUSERSITE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

step "build the wheel (from a copy of the sources: no build/ left in the checkout)"
mkdir "$WORK/src"
cp "$ROOT/pyproject.toml" "$ROOT/setup.cfg" "$ROOT/README.md" "$WORK/src/"
cp -r "$ROOT/keras_antisym" "$WORK/src/"
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
"$PYTHON" -m build --wheel --outdir "$WORK/dist" "$WORK/src" > "$WORK/build.log" 2>&1 ||
    { tail -40 "$WORK/build.log"; fail "python -m build --wheel"; }
shopt -s nullglob
WHEELS=("$WORK"/dist/*.whl)
[[ ${#WHEELS[@]} -eq 1 ]] || fail "expected one wheel, found ${#WHEELS[@]}"
WHEEL=${WHEELS[0]}
echo "built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"

step "twine check"
"$PYTHON" -m twine check --strict "$WHEEL" || fail "twine check"

step "wheel contents: keras_antisym only, with py.typed"
"$PYTHON" - "$WHEEL" <<'EOF' || fail "wheel contents"
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
tops = sorted({name.split("/")[0] for name in names})
packages = [top for top in tops if not top.endswith(".dist-info")]
print(f"{len(names)} files; top-level: {', '.join(tops)}")
assert packages == ["keras_antisym"], f"unexpected top-level entries: {packages}"
assert "keras_antisym/py.typed" in names, "keras_antisym/py.typed is not in the wheel"
assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")], "bytecode in the wheel"
EOF

step "fresh virtual environment: the wheel and jax"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install --quiet "$WHEEL" jax > "$WORK/pip.log" 2>&1 ||
    { tail -40 "$WORK/pip.log"; fail "pip install the wheel and jax"; }
"$VPY" -m pip list --format=freeze 2>/dev/null | grep -iE '^(keras|keras-antisym|jax|jaxlib|numpy)==' || true

mkdir "$WORK/run"
cd "$WORK/run"  # an empty folder: the checkout is not importable from here
export KERAS_BACKEND=jax

step "installed package: from the venv, py.typed, no TensorFlow or PyTorch"
"$VPY" - "$WORK/venv" <<'EOF' || fail "installed package"
import importlib.util
import os
import sys

spec = importlib.util.find_spec("keras_antisym")
assert spec is not None and spec.origin, "keras_antisym is not installed"
package = os.path.dirname(spec.origin)
venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(package).startswith(venv + os.sep), f"imported from {package}"
assert os.path.isfile(os.path.join(package, "py.typed")), f"no py.typed in {package}"
for name in ("tensorflow", "torch"):
    assert importlib.util.find_spec(name) is None, f"{name} is installed"
print(f"keras_antisym at {package}, py.typed present; tensorflow and torch absent")
EOF

step "README.md's Example (the first python block under '## Example'), KERAS_BACKEND=jax"
"$VPY" - "$ROOT/README.md" "$WORK/run/example.py" <<'EOF' || fail "extracting the README example"
import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
section = re.search(r"^## Example[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
assert section, "README.md has no '## Example' section"
block = re.search(r"^```python[ \t]*\n(.*?)^```", section.group(1), re.M | re.S)
assert block, "the '## Example' section has no python block"
open(sys.argv[2], "w", encoding="utf-8").write(block.group(1))
print(f"{block.group(1).count(chr(10))} lines")
EOF
"$VPY" -c 'import keras; assert keras.backend.backend() == "jax", keras.backend.backend()' ||
    fail "Keras does not run on JAX"
"$VPY" example.py || fail "README.md's Example"

printf '\ncheck_wheel: OK: %s built, twine-checked, installed with jax alone; py.typed shipped; README Example ran (%ss)\n' \
    "$(basename "$WHEEL")" "$((SECONDS - START))"
