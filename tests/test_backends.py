"""The same numbers on the TensorFlow, JAX and PyTorch backends.

Each backend runs `tests/backend_probe.py` in its own process (Keras picks
its backend once per process) and is compared with the NumPy reference.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import reference
from tests.backend_probe import CASES
from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]
BACKEND_MODULES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


@pytest.fixture(scope="module")
def probe_inputs(tmp_path_factory):
    rng = np.random.RandomState(0)
    inputs = {f: rng.standard_normal((3, 10, f)).astype("float32") for f in (4, 9)}
    mask = np.ones((3, 10), bool)
    mask[0, 6:] = False
    mask[2, [2, 3]] = False
    data = {"mask": mask, **{f"x{f}": x for f, x in inputs.items()}}
    expected = {}
    for name, _, gated, kwargs, masked, features in CASES:
        x = inputs[features]
        antisymmetric = kwargs.get("antisymmetric", True)
        blocks = 2 if gated else 1
        shapes = [(features, blocks * 5), (10,) if antisymmetric else (5, 5), (blocks * 5,)]
        weights = [(0.5 * rng.standard_normal(s)).astype("float32") for s in shapes]
        for i, w in enumerate(weights):
            data[f"{name}_w{i}"] = w
        expected[name], _ = reference.run(
            weights,
            x,
            units=5,
            epsilon=0.3,
            gamma=0.05,
            gated=gated,
            antisymmetric=antisymmetric,
            mask=mask if masked else None,
            go_backwards=kwargs.get("go_backwards", False),
        )
    path = tmp_path_factory.mktemp("probe") / "inputs.npz"
    np.savez(path, **data)
    return path, expected


@pytest.mark.parametrize("backend", sorted(BACKEND_MODULES))
def test_backend_matches_numpy_reference(backend, probe_inputs, tmp_path):
    if importlib.util.find_spec(BACKEND_MODULES[backend]) is None:
        pytest.fail(f"backend {backend} is not installed: `.ci/run` installs it")
    in_path, expected = probe_inputs
    out_path = tmp_path / "out.npz"
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tests.backend_probe", str(in_path), str(out_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(600),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(out_path)
    assert str(out["backend"]) == backend
    assert not out["accelerator"]  # CUDA_VISIBLE_DEVICES="" hides any GPU
    for name in expected:
        np.testing.assert_allclose(out[name], expected[name], atol=2e-5, err_msg=name)
    for kind in ("cell", "fused"):
        loss = out[f"{kind}_fit_loss"]
        assert np.all(np.isfinite(loss)) and loss[-1] < 0.8 * loss[0], (kind, loss)
        stateful = out[f"{kind}_stateful_loss"]
        assert np.all(np.isfinite(stateful)), (kind, stateful)
        assert np.isfinite(out[f"{kind}_stateful_update"]) and out[f"{kind}_stateful_update"] > 0
        _check_stateful_carry(out, kind)
        before, after = out[f"{kind}_roundtrip"]
        np.testing.assert_allclose(after, before, atol=1e-6)


def _check_stateful_carry(out, kind):
    """Stateful chunks equal the NumPy reference on the whole sequence; reset starts over."""
    from benchmarks import reference

    x = np.random.RandomState(11).standard_normal((2, 8, 3)).astype("float32")
    flat = out[f"{kind}_stateful_weights"]
    shapes = [(3, 10), (10,), (10,)]  # kernel (m, 2n), upper triangle of 5x5, bias (2n)
    weights, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        weights.append(flat[offset : offset + size].reshape(shape))
        offset += size
    continued, fresh = out[f"{kind}_stateful_carry"]
    _, whole = reference.run(weights, x, units=5, epsilon=0.3, gamma=0.02, gated=True)
    _, second = reference.run(weights, x[:, 4:], units=5, epsilon=0.3, gamma=0.02, gated=True)
    np.testing.assert_allclose(continued, whole, atol=1e-5)
    np.testing.assert_allclose(fresh, second, atol=1e-5)
