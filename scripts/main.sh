#!/usr/bin/env bash
# The main job, offline on a fresh machine: train on the embedded digits task,
# export a SavedModel, serve it over TF Serving's REST API, predict, stop.
set -euo pipefail
. "$(dirname "$0")/venv.sh"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
python -m serving.demo "$@"
