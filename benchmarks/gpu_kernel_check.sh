#!/usr/bin/env bash
# The GPU check of the fused recurrence kernels in one command (about 5 minutes on one
# GPU; JAX, then PyTorch, each in its own process):
#
#   bash benchmarks/gpu_kernel_check.sh [--quick]
#
# Results: $OUT/gpu-kernel.txt (targets, timings, numerics) and one JSON per backend,
# where OUT names a folder collected after the run; without OUT, runs/benchmarks/.
# Where python3 holds JAX, PyTorch and Triton but no Keras, Keras and the two packages it
# needs are installed from wheels in .whl/ (ignored by git), downloaded beforehand with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#     --platform manylinux_2_17_x86_64 -d .whl keras==3.15.1 namex optree
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import keras" 2>/dev/null; then
    SITE=$(mktemp -d)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$SITE" .whl/*.whl || exit 1
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3 TRITON_DEFAULT_FP_FUSION=1
OUTPUT=${OUT:-runs/benchmarks}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv 2>/dev/null
"$PYTHON" -c "import jax, torch, triton; print('jax', jax.__version__, jax.devices(), \
'torch', torch.__version__, 'triton', triton.__version__)"
# Each backend gets at most 200 s; what it measured before is kept.
timeout 440 "$PYTHON" -m benchmarks.gpu_kernel_check --output "$OUTPUT" --timeout 200 "$@"
