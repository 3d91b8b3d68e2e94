"""The fused recurrence kernels (keras_antisym.kernels) on a CPU, on tiny shapes.

Pallas runs with `interpret=True`, Triton under its interpreter
(`TRITON_INTERPRET=1`, in a PyTorch-only subprocess: Triton and TensorFlow
must not share a process). Both are checked against the float64 NumPy
reference and against autodiff of a plain loop; both are also compiled for
a Hopper GPU (Pallas: lowered to Triton IR; Triton: down to a cubin), which
needs no GPU. The layers' `fused_kernel` path runs per backend in a
subprocess (`python -m tests.test_kernels layer BACKEND OUT`), with
`KERAS_ANTISYM_KERNEL_INTERPRET=1`: without it, `fused_kernel=True` on a CPU
raises.
"""

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import reference
from benchmarks.gradients import outputs_and_grads
from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]
EPSILON, GAMMA = 0.3, 0.05
# Interpreted float32 against float64 (reference) or float32 autodiff (loops).
ATOL = 2e-5


def problem(gated, batch=3, steps=6, features=2, units=5, seed=0):
    """Weights and inputs, and the kernel's operands `u`, `mt`, `h0` built from them."""
    rng = np.random.RandomState(seed)
    blocks = 2 if gated else 1
    kernel = 0.5 * rng.standard_normal((features, blocks * units))
    triangle = 0.5 * rng.standard_normal(units * (units - 1) // 2)
    bias = 0.5 * rng.standard_normal(blocks * units)
    x = rng.standard_normal((batch, steps, features))
    h0 = 0.5 * rng.standard_normal((batch, units))
    weights = [kernel, triangle, bias]
    mt = reference.transition_matrix(triangle, units, GAMMA).T
    u = x @ kernel + bias
    f32 = [a.astype("float32") for a in (u, mt, h0)]
    return weights, x, f32, rng.standard_normal((batch, steps, units)).astype("float32")


def expected_states(gated, weights, x, h0):
    units = h0.shape[1]
    states, _ = reference.run(
        weights, x, units=units, epsilon=EPSILON, gamma=GAMMA, gated=gated, h0=h0
    )
    return states


def scan_recurrence(u, mt, h0, gated):
    """A plain `jax.lax.scan` of the recurrence: the gradients' reference."""
    import jax
    import jax.numpy as jnp

    n = mt.shape[0]

    def step(h, ut):
        shared = jnp.dot(h, mt, precision="highest")
        if gated:
            rate = jax.nn.sigmoid(shared + ut[:, :n]) * jnp.tanh(shared + ut[:, n:])
        else:
            rate = jnp.tanh(shared + ut)
        h = h + EPSILON * rate
        return h, h

    _, states = jax.lax.scan(step, h0, jnp.swapaxes(u, 0, 1))
    return jnp.swapaxes(states, 0, 1)


# `(batch, units)`: a batch of 3 is one padded 16-row tile (products on tensor
# cores on a GPU), a batch of 1 its own tile (a broadcast product); 5 units
# are padded to 16; 16 rows of 16 units need no padding.
SHAPES = [(3, 5), (1, 5), (16, 16)]


@pytest.mark.parametrize("batch,units", SHAPES)
@pytest.mark.parametrize("gated", [False, True])
def test_pallas_recurrence_matches_reference_and_scan_gradients(gated, batch, units):
    import jax

    from keras_antisym.kernels import pallas_recurrence

    weights, x, (u, mt, h0), probe = problem(gated, batch=batch, units=units)
    states = pallas_recurrence.recurrence(u, mt, h0, EPSILON, gated, interpret=True)
    np.testing.assert_allclose(states, expected_states(gated, weights, x, h0), atol=ATOL)

    def loss(fn):
        return lambda *a: (fn(*a) * probe).sum()

    def kernel(u, mt, h0):
        return pallas_recurrence.recurrence(u, mt, h0, EPSILON, gated, interpret=True)

    got = jax.grad(loss(kernel), argnums=(0, 1, 2))(u, mt, h0)
    want = jax.grad(loss(lambda *a: scan_recurrence(*a, gated)), argnums=(0, 1, 2))(u, mt, h0)
    for name, g, w in zip(("u", "mt", "h0"), got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, err_msg=name)


# bfloat16 `u` and `mt` (a layer under mixed_bfloat16), float32 state: against the
# float64 reference of the unrounded operands the error is that of rounding `u`
# and `M` to bfloat16 once (2⁻⁹ relative), not one rounding per step.
BFLOAT16_ATOL = 1e-2


@pytest.mark.parametrize("batch,units", [(3, 5), (16, 16)])
@pytest.mark.parametrize("gated", [False, True])
def test_pallas_recurrence_takes_bfloat16_inputs_with_a_float32_state(gated, batch, units):
    import jax
    import jax.numpy as jnp

    from keras_antisym.kernels import pallas_recurrence

    weights, x, (u, mt, h0), probe = problem(gated, batch=batch, units=units)
    u16, mt16 = jnp.asarray(u, jnp.bfloat16), jnp.asarray(mt, jnp.bfloat16)
    states = pallas_recurrence.recurrence(u16, mt16, h0, EPSILON, gated, interpret=True)
    assert states.dtype == jnp.float32
    # Exactly the float32 recurrence of the rounded operands: float32 accumulation.
    rounded = [np.asarray(a, "float32") for a in (u16, mt16)]
    np.testing.assert_allclose(states, scan_recurrence(*rounded, h0, gated), atol=ATOL)
    reference_states = expected_states(gated, weights, x, h0)
    np.testing.assert_allclose(states, reference_states, atol=BFLOAT16_ATOL)

    def loss(u, mt, h0):
        return (
            pallas_recurrence.recurrence(u, mt, h0, EPSILON, gated, interpret=True) * probe
        ).sum()

    got = jax.grad(loss, argnums=(0, 1, 2))(u16, mt16, h0)
    assert [g.dtype for g in got] == [jnp.bfloat16, jnp.bfloat16, jnp.float32]
    want = jax.grad(lambda *a: (scan_recurrence(*a, gated) * probe).sum(), argnums=(0, 1, 2))(
        *rounded, h0
    )
    for name, g, w in zip(("u", "mt", "h0"), got, want, strict=True):
        # The bfloat16 gradients are rounded once (2⁻⁹ relative).
        np.testing.assert_allclose(np.asarray(g, "float32"), w, rtol=1e-2, atol=1e-2, err_msg=name)


def test_pallas_recurrence_checks_precision():
    from keras_antisym.kernels import pallas_recurrence

    _, _, (u, mt, h0), _ = problem(False)
    with pytest.raises(ValueError, match="precision"):
        pallas_recurrence.recurrence(u, mt, h0, EPSILON, precision="fp8")


@pytest.mark.parametrize("batch", [20, 1])
@pytest.mark.parametrize("gated", [False, True])
def test_pallas_kernels_lower_for_a_cuda_gpu(gated, batch):
    """Forward and backward lower through Pallas' Triton backend (no GPU needed)."""
    import jax
    import jax.numpy as jnp
    from jax import export

    from keras_antisym.kernels import pallas_recurrence

    n, k = 32, 2 if gated else 1
    shapes = [(batch, 7, k * n), (n, n), (batch, n)]
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]

    def loss(u, mt, h0):
        return pallas_recurrence.recurrence(u, mt, h0, 0.1, gated, interpret=False).sum()

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    triton_call = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
    exported = export.export(step, platforms=["cuda"], disabled_checks=[triton_call])(*args)
    assert exported.mlir_module().count("xla.gpu.triton") == 2  # forward, backward


SUBPROCESS_LIMIT = limit(600)


def run_subprocess(args, backend, interpret=True, timeout=SUBPROCESS_LIMIT):
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "TRITON_INTERPRET": "1" if interpret else "0",
        "KERAS_ANTISYM_KERNEL_INTERPRET": "1" if interpret else "0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_kernels", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def needs_triton():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton)")


@pytest.mark.parametrize("batch,units", SHAPES)
@pytest.mark.parametrize("gated", [False, True])
def test_triton_recurrence_matches_reference_and_torch_gradients(gated, batch, units, tmp_path):
    needs_triton()
    weights, x, (u, mt, h0), probe = problem(gated, batch=batch, units=units)
    path = tmp_path / "io.npz"
    np.savez(path, u=u, mt=mt, h0=h0, probe=probe)
    run_subprocess(["triton", str(int(gated)), str(path)], "torch")
    out = np.load(tmp_path / "io.out.npz")
    np.testing.assert_allclose(out["states"], expected_states(gated, weights, x, h0), atol=ATOL)
    np.testing.assert_allclose(out["nograd"], out["states"], atol=0)
    for name in ("u", "mt", "h0"):
        np.testing.assert_allclose(out[f"d{name}"], out[f"want_d{name}"], atol=ATOL, err_msg=name)


@pytest.mark.parametrize("gated", [False, True])
def test_triton_recurrence_takes_bfloat16_inputs_with_a_float32_state(gated, tmp_path):
    """bfloat16 `u` and `mt` read by the kernel, widened to float32: the float32 recurrence
    of the rounded operands (`ATOL`), the float64 reference within `BFLOAT16_ATOL`."""
    needs_triton()
    weights, x, (u, mt, h0), probe = problem(gated)
    path = tmp_path / "io.npz"
    np.savez(path, u=u, mt=mt, h0=h0, probe=probe, bfloat16=True)
    run_subprocess(["triton", str(int(gated)), str(path)], "torch")
    out = np.load(tmp_path / "io.out.npz")
    # du, dmt bfloat16 as their inputs; dh0 and the states float32.
    np.testing.assert_array_equal(out["dtypes"], [1, 1, 0, 0])
    np.testing.assert_allclose(out["nograd"], out["states"], atol=0)
    np.testing.assert_allclose(
        out["states"], expected_states(gated, weights, x, h0), atol=BFLOAT16_ATOL
    )
    for name in ("u", "mt", "h0"):
        np.testing.assert_allclose(
            out[f"d{name}"], out[f"want_d{name}"], rtol=1e-2, atol=1e-2, err_msg=name
        )


def test_triton_kernels_compile_for_hopper():
    needs_triton()
    assert "compiled 8" in run_subprocess(["compile"], "torch", interpret=False)


def triton_probe(gated, path):
    """Subprocess side: the Triton kernel (interpreted) and torch autograd of a loop."""
    import torch

    from keras_antisym.kernels import triton_recurrence

    data = {k: torch.tensor(v) for k, v in np.load(path).items()}
    probe, n = data.pop("probe"), data["mt"].shape[0]
    if bool(data.pop("bfloat16", torch.tensor(False))):  # bfloat16 `u`, `mt`; float32 `h0`
        data["u"], data["mt"] = data["u"].bfloat16(), data["mt"].bfloat16()
    leaves = {k: v.clone().requires_grad_() for k, v in data.items()}
    states = triton_recurrence.recurrence(*leaves.values(), EPSILON, gated)
    grads = torch.autograd.grad((states * probe).sum(), list(leaves.values()))
    loop = {k: v.float().clone().requires_grad_() for k, v in data.items()}
    h, outs = loop["h0"], []
    for t in range(loop["u"].shape[1]):
        shared, ut = h @ loop["mt"], loop["u"][:, t]
        if gated:
            rate = torch.sigmoid(shared + ut[:, :n]) * torch.tanh(shared + ut[:, n:])
        else:
            rate = torch.tanh(shared + ut)
        h = h + EPSILON * rate
        outs.append(h)
    want = torch.autograd.grad((torch.stack(outs, 1) * probe).sum(), list(loop.values()))
    with torch.no_grad():
        nograd = triton_recurrence.recurrence(*data.values(), EPSILON, gated)
    result = {"states": states.detach(), "nograd": nograd}
    result.update({f"d{k}": g for k, g in zip(leaves, grads, strict=True)})
    result.update({f"want_d{k}": g for k, g in zip(leaves, want, strict=True)})
    result["dtypes"] = torch.tensor([g.dtype == torch.bfloat16 for g in (*grads, states)])
    np.savez(
        str(path)[: -len(".npz")] + ".out.npz", **{k: v.float().numpy() for k, v in result.items()}
    )


def triton_compile():
    """Subprocess side: both kernels, gated and not, whole and small tiles, for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from keras_antisym.kernels import triton_recurrence as tr

    ptr, count = "*fp32", 0
    forward = dict.fromkeys(("u_ptr", "mt_ptr", "h0_ptr", "h_ptr", "s_ptr"), ptr)
    forward.update(steps="i32", eps="fp32")
    backward = dict.fromkeys(("dh_ptr", "s_ptr", "mt_ptr", "du_ptr", "dh0_ptr"), ptr)
    backward.update(steps="i32")
    for gated, rows in itertools.product((False, True), (tr.BLOCK_BATCH, 1)):
        constants = {"N": 128, "BB": rows, "GATED": gated, "PRECISION": "ieee"}
        for fn, signature, extra in (
            (tr._forward_kernel, forward, {"SLOPES": True}),
            (tr._backward_kernel, backward, {}),
        ):
            signature = {**signature, **dict.fromkeys({**constants, **extra}, "constexpr")}
            source = ASTSource(fn, signature, constexprs={**constants, **extra})
            warps = tr.tile_warps("float32") if rows == tr.BLOCK_BATCH else tr.SMALL_BATCH_WARPS
            options = {"num_warps": warps}
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
            assert compiled.asm["cubin"]
            count += 1
    print(f"compiled {count}")


@pytest.mark.parametrize("value", ["auto", True, False])
def test_fused_kernel_round_trips_in_the_config(value, monkeypatch):
    """Configs with each value load again: `True` where the kernel can run (here the
    TensorFlow backend, counted as a kernel backend), `"auto"` and `False` anywhere."""
    from keras_antisym import AntisymmetricRNN, GatedAntisymmetricRNN, kernels

    monkeypatch.setattr(kernels, "KERNEL_BACKENDS", ("tensorflow",))
    for cls in (AntisymmetricRNN, GatedAntisymmetricRNN):
        layer = cls(4, fused_kernel=value)
        assert layer.fused_kernel == value and layer.get_config()["fused_kernel"] == value
        assert cls.from_config(layer.get_config()).fused_kernel == value
        if value is True:  # the loop's own backend: the kernel or an error
            monkeypatch.setattr(kernels, "KERNEL_BACKENDS", ("jax", "torch"))
            with pytest.raises(ValueError, match=re.escape(BACKEND_MESSAGE)):
                cls.from_config(layer.get_config())
            monkeypatch.setattr(kernels, "KERNEL_BACKENDS", ("tensorflow",))
    assert AntisymmetricRNN(4).fused_kernel == "auto"  # the kernel on a CUDA GPU, else the loop


@pytest.mark.parametrize("value", ["yes", None, 1.0, "Auto"])
def test_fused_kernel_rejects_other_values(value):
    from keras_antisym import GatedAntisymmetricRNN

    expected = "Received an invalid value for argument `fused_kernel`, expected "
    with pytest.raises(ValueError, match=expected):
        GatedAntisymmetricRNN(4, fused_kernel=value)


BACKEND_MESSAGE = (
    'Received an invalid value for argument `fused_kernel`, expected "auto" or False on the '
    "tensorflow backend (the fused kernel runs on JAX and PyTorch), got True."
)
#: The end of each message of a condition that `fused_kernel=True` does not meet.
FALL_BACK = (
    'The fused kernel cannot run otherwise; pass `fused_kernel="auto"` to fall back to the '
    "time loop."
)


def unmet(name, expected, got):
    return (
        f"Received an invalid value for argument `{name}`, expected {expected} with "
        f"`fused_kernel=True`, got {got}. {FALL_BACK}"
    )


def test_tensorflow_backend_raises_at_construction_and_auto_keeps_the_loop(monkeypatch):
    """In this (TensorFlow) process `fused_kernel=True` raises when the layer is built;
    `"auto"` takes the loop, with the loop's numbers."""
    import keras

    from keras_antisym import AntisymmetricRNN, GatedAntisymmetricRNN, kernels

    def fail(*args, **kwargs):
        raise AssertionError("the kernel ran")

    monkeypatch.setattr(kernels, "recurrence", fail)
    monkeypatch.setattr(kernels, "cuda_available", lambda: True)
    assert keras.backend.backend() == "tensorflow"
    for cls in (AntisymmetricRNN, GatedAntisymmetricRNN):
        with pytest.raises(ValueError) as info:
            cls(5, fused_kernel=True)
        assert str(info.value) == BACKEND_MESSAGE
    x = np.random.RandomState(1).standard_normal((3, 6, 2)).astype("float32")
    auto = AntisymmetricRNN(5, epsilon=EPSILON, gamma=GAMMA, fused_kernel="auto")
    auto(x)
    weights = [0.5 * np.random.RandomState(2).standard_normal(w.shape) for w in auto.weights]
    auto.set_weights(weights)
    _, expected = reference.run(weights, x, units=5, epsilon=EPSILON, gamma=GAMMA)
    np.testing.assert_allclose(np.asarray(auto(x)), expected, atol=ATOL)
    cell = AntisymmetricRNN(5, activation="relu").cell
    assert not kernels.kernel_applies(cell, x, True)


# Conditions fixed at construction: (layer arguments, the argument named, expected, got).
CONSTRUCTION_CONDITIONS = {
    "activation": ({"activation": "relu"}, "activation", "'tanh'", "'relu'"),
    "recurrent_activation": (
        {"recurrent_activation": "hard_sigmoid"},
        "recurrent_activation",
        "'sigmoid'",
        "'hard_sigmoid'",
    ),
    "recurrent_dropout": ({"recurrent_dropout": 0.25}, "recurrent_dropout", "0", "0.25"),
    "units": ({"units": 129}, "units", "at most 128", "129"),
    "dtype": (
        {"dtype": "float64"},
        "dtype",
        "a dtype policy that computes in float32 or bfloat16",
        "'float64'",
    ),
    "mixed-precision": (
        {"dtype": "mixed_float16"},
        "dtype",
        "a dtype policy that computes in float32 or bfloat16",
        "'mixed_float16'",
    ),
}


def _kernel_backend_here(monkeypatch, interpret=True):
    """This TensorFlow process counted as a kernel backend, interpret mode as given."""
    from keras_antisym import kernels

    monkeypatch.setattr(kernels, "KERNEL_BACKENDS", ("tensorflow",))
    monkeypatch.setattr(kernels, "INTERPRET", interpret)
    return kernels


@pytest.mark.parametrize("condition", sorted(CONSTRUCTION_CONDITIONS))
def test_fused_kernel_true_raises_at_construction(condition, monkeypatch):
    """Each condition fixed by the layer's arguments raises when the layer is built,
    naming the argument; `"auto"` builds the same layer."""
    from keras_antisym import GatedAntisymmetricRNN

    _kernel_backend_here(monkeypatch)
    args, name, expected, got = CONSTRUCTION_CONDITIONS[condition]
    args = {"units": 4, **args}
    with pytest.raises(ValueError) as info:
        GatedAntisymmetricRNN(fused_kernel=True, **args)
    assert str(info.value) == unmet(name, expected, got)
    assert GatedAntisymmetricRNN(fused_kernel="auto", **args).fused_kernel == "auto"


def test_global_dtype_policy_counts_as_the_layers(monkeypatch):
    import keras

    from keras_antisym import AntisymmetricRNN

    _kernel_backend_here(monkeypatch)
    keras.config.set_dtype_policy("mixed_float16")  # reset by conftest
    with pytest.raises(ValueError) as info:
        AntisymmetricRNN(4, fused_kernel=True)
    expected = unmet(
        "dtype", "a dtype policy that computes in float32 or bfloat16", "'mixed_float16'"
    )
    assert str(info.value) == expected


def test_fused_kernel_true_raises_for_a_mask_at_the_call(monkeypatch):
    from keras_antisym import AntisymmetricRNN

    _kernel_backend_here(monkeypatch)
    layer = AntisymmetricRNN(4, fused_kernel=True)
    x = np.zeros((3, 6, 2), "float32")
    with pytest.raises(ValueError) as info:
        layer(x, mask=np.ones((3, 6), bool))
    assert unmet("mask", "None", "a mask of shape (3, 6)") in str(info.value)


@pytest.mark.parametrize(
    "shape, dtype, expected, got",
    [
        (
            (3, None, 2),
            "float32",
            "a static number of timesteps",
            "sequences of shape (3, None, 2)",
        ),
        (
            (3, 0, 2),
            "float32",
            "at least one timestep and one feature",
            "sequences of shape (3, 0, 2)",
        ),
        (
            (3, 6, 0),
            "float32",
            "at least one timestep and one feature",
            "sequences of shape (3, 6, 0)",
        ),
        ((3, 6, 2), "float64", "float32 or bfloat16 sequences", "float64 sequences"),
        (
            (2**14, 2**10, 2),
            "float32",
            "fewer than 2**31 projected inputs, padded (`(batch + 15) * timesteps * "
            "blocks * padded units`)",
            "sequences of shape (16384, 1024, 2)",
        ),
    ],
)
def test_fused_kernel_true_checks_the_sequences_at_the_call(
    monkeypatch, shape, dtype, expected, got
):
    """Conditions on the sequences, known at the call (here on symbolic sequences)."""
    import keras

    from keras_antisym import AntisymmetricRNN

    kernels = _kernel_backend_here(monkeypatch)
    cell = AntisymmetricRNN(128, fused_kernel=True).cell
    sequences = keras.KerasTensor(shape, dtype=dtype)
    with pytest.raises(ValueError) as info:
        kernels.check_call(cell, sequences, None)
    assert str(info.value) == unmet("sequences", expected, got)
    assert not kernels.kernel_applies(cell, sequences, True)


def test_fused_kernel_true_without_a_cuda_gpu(monkeypatch):
    """Without a CUDA GPU, `True` raises unless interpret mode is on (on PyTorch also
    Triton's interpreter, and Triton itself)."""
    import keras

    from keras_antisym import AntisymmetricRNN

    kernels = _kernel_backend_here(monkeypatch, interpret=False)
    layer = AntisymmetricRNN(4, fused_kernel=True)
    x = np.zeros((3, 6, 2), "float32")
    with pytest.raises(ValueError) as info:
        layer(x)
    message = (
        'Received an invalid value for argument `fused_kernel`, expected "auto" or False '
        "without a CUDA GPU (set KERAS_ANTISYM_KERNEL_INTERPRET=1 to interpret the kernel, "
        "for tests{}), got True."
    )
    assert message.format("") in str(info.value)
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    monkeypatch.setattr(kernels, "cuda_available", lambda: False)
    monkeypatch.setattr(kernels, "_triton_found", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch_message = message.format(", with TRITON_INTERPRET=1 before triton is imported")
    assert str(kernels._device_problem()) == torch_message
    monkeypatch.setattr(kernels, "INTERPRET", True)
    assert str(kernels._device_problem()) == torch_message
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels._device_problem() is None
    monkeypatch.setattr(kernels, "_triton_found", lambda: False)
    assert str(kernels._device_problem()) == (
        'Received an invalid value for argument `fused_kernel`, expected "auto" or False '
        "without Triton (pip install triton), got True."
    )
    monkeypatch.setattr(kernels, "_triton_found", lambda: True)
    monkeypatch.setattr(kernels, "INTERPRET", False)
    monkeypatch.setattr(kernels, "cuda_available", lambda: True)
    assert kernels._device_problem() is None


def test_interpret_mode_is_off_unless_the_environment_sets_it():
    code = "from keras_antisym import kernels; print(kernels.INTERPRET)"
    for value, expected in (("0", "False"), ("1", "True")):
        env = {**os.environ, "KERAS_BACKEND": "jax", "KERAS_ANTISYM_KERNEL_INTERPRET": value}
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert proc.stdout.strip() == expected, proc.stderr[-2000:]


def test_kernel_sizes():
    from keras_antisym.kernels import MAX_UNITS, fits

    assert MAX_UNITS == 128 and fits(128, 784, 128, 2) and fits(None, 10, 5, 1)
    assert not fits(128, 784, 129, 1)  # W would not stay on chip
    assert not fits(2**14, 2**10, 128, 1)  # 2**31 projected inputs


# The layer cases: (name, gated, layer arguments, call arguments).
LAYER_CASES = [
    (f"{'gated' if gated else 'plain'}-{name}", gated, layer_args, call_args)
    for gated in (False, True)
    for name, layer_args, call_args in (
        ("sequences", {"return_sequences": True}, {}),
        ("state", {"return_state": True}, {}),
        ("backwards", {"return_sequences": True, "go_backwards": True}, {}),
        ("initial", {"return_sequences": True}, {"initial_state": True}),
        ("dropout", {"dropout": 0.4, "seed": 7}, {"training": True}),
    )
]
# What the kernel cannot run: `fused_kernel=True` raises (naming the argument), `"auto"`
# takes the loop (no kernel call off a CUDA GPU, and here not even on one).
LOOP_CASES = {
    "mask": ({}, {"mask": True}, "`mask`"),
    "recurrent-dropout": (
        {"recurrent_dropout": 0.3, "seed": 7},
        {"training": True},
        "`recurrent_dropout`",
    ),
    "activation": ({"activation": "relu"}, {}, "`activation`"),
}
LAYER_RTOL, LAYER_ATOL = 1e-5, 1e-6


# JAX compiles each configuration (half a minute on two cores): CI's slow pass runs it.
@pytest.mark.parametrize("backend", [pytest.param("jax", marks=pytest.mark.slow), "torch"])
def test_layers_fused_kernel_matches_the_loop(backend, tmp_path):
    if backend == "torch":
        needs_triton()
    out = tmp_path / "layer.json"
    run_subprocess(["layer", str(out)], backend)
    results = json.loads(out.read_text())
    for name, _, _, _ in LAYER_CASES:
        case = results[name]
        assert case["kernel_calls"] > 0, name
        for key, (error, scale) in case["errors"].items():
            assert error <= LAYER_ATOL + LAYER_RTOL * scale, (name, key, error, scale)
    for name, (_, _, argument) in LOOP_CASES.items():
        case = results[name]
        assert case["kernel_calls"] == 0, name
        assert argument in case["error"] and "fused_kernel=True" in case["error"], case
        for key, (error, scale) in case["errors"].items():
            assert error <= LAYER_ATOL + LAYER_RTOL * scale, (name, key, error, scale)
    assert results["stateful"]["kernel_calls"] > 0
    for error, scale in results["stateful"]["errors"].values():
        assert error <= LAYER_ATOL + LAYER_RTOL * scale


def _compare(layer_args, call_args, gated, x, counter, calls=1, fused="kernel"):
    """Max abs errors (and scales) of fused_kernel=True (or `fused`) against False."""
    from keras import ops

    from keras_antisym import AntisymmetricRNN, GatedAntisymmetricRNN

    cls = GatedAntisymmetricRNN if gated else AntisymmetricRNN
    args = dict(epsilon=EPSILON, gamma=GAMMA, **layer_args)
    call_args = dict(call_args)
    if call_args.pop("initial_state", False):
        call_args["initial_state"] = [0.5 * np.cos(np.arange(x.shape[0] * 5.0)).reshape(-1, 5)]
    if call_args.pop("mask", False):
        call_args["mask"] = np.arange(x.shape[1])[None, :] < np.array([[3], [6], [5]])
    results = []
    for value in (True if fused == "kernel" else fused, False):
        layer = cls(5, fused_kernel=value, **args)
        layer.build(x.shape)
        rng = np.random.RandomState(0)
        layer.set_weights([0.5 * rng.standard_normal(w.shape) for w in layer.get_weights()])
        before = counter[0]
        for _ in range(calls):
            outputs, grads = outputs_and_grads(layer, x, call_args)
        assert value or counter[0] == before, "fused_kernel=False called the kernel"
        flat = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        results.append([ops.convert_to_numpy(a) for a in list(flat) + list(grads)])
    errors = {
        f"array{i}": (float(np.abs(a - b).max()), float(np.abs(b).max()))
        for i, (a, b) in enumerate(zip(*results, strict=True))
    }
    return errors


def layer_probe(out_path):
    """Subprocess side: every layer case, kernel against loop, on this backend."""
    from keras_antisym import kernels

    counter, original = [0], kernels.recurrence

    def counting(*args, **kwargs):
        counter[0] += 1
        return original(*args, **kwargs)

    kernels.recurrence = counting
    x = np.random.RandomState(1).standard_normal((3, 6, 2)).astype("float32")
    results = {}
    cases = [(n, g, la, ca, 1) for n, g, la, ca in LAYER_CASES]
    cases.append(("stateful", True, {"stateful": True, "return_sequences": True}, {}, 2))
    for name, gated, layer_args, call_args, calls in cases:
        counter[0] = 0
        errors = _compare(layer_args, call_args, gated, x, counter, calls)
        results[name] = {"errors": errors, "kernel_calls": counter[0]}
    for name, (layer_args, call_args, _) in LOOP_CASES.items():
        try:
            _compare(layer_args, call_args, False, x, counter)
            error = "no error"
        except ValueError as exc:
            error = str(exc)
        counter[0] = 0
        errors = _compare(layer_args, call_args, False, x, counter, fused="auto")
        results[name] = {"errors": errors, "kernel_calls": counter[0], "error": error}
    Path(out_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "triton":
        triton_probe(bool(int(rest[0])), rest[1])
    elif command == "compile":
        triton_compile()
    elif command == "layer":
        layer_probe(rest[0])
