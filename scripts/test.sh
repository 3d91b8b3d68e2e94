#!/usr/bin/env bash
# The test suite on a fresh machine: install into .venv, lint, type-check, build the docs, run pytest.
set -euo pipefail
. "$(dirname "$0")/venv.sh"
# PyTorch for the torch-backend tests: the CPU build (these machines carry torch
# 2.13.0 CPU for Python 3.11; a plain `torch` would pull a multi-GB CUDA build),
# and Triton, whose interpreter runs the fused kernel's tests without a GPU.
python -m pip install --quiet "torch==2.13.0" "triton==3.9.0"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
ruff check .
# Type hints of the library and the application (pyproject.toml configures mypy) and the
# documentation site.
mypy
bash scripts/docs.sh
# One worker per core (this machine and CI have 2); -v names each test as it ends, and
# pyproject.toml adds a per-test time limit and the slowest tests at the end. The tests
# marked slow are left out (PYTEST_MARKERS="" runs everything; "slow" only those).
python -m pytest -v -n "${PYTEST_WORKERS:-2}" --dist loadfile -m "${PYTEST_MARKERS-not slow}" "$@"
