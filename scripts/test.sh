#!/usr/bin/env bash
# The test suite on a fresh machine: install into .venv, lint, run pytest.
set -euo pipefail
. "$(dirname "$0")/venv.sh"
# PyTorch for the torch-backend tests: the CPU build (these machines carry torch
# 2.13.0 CPU for Python 3.11; a plain `torch` would pull a multi-GB CUDA build).
python -m pip install --quiet "torch==2.13.0"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
ruff check .
python -m pytest -q "$@"
