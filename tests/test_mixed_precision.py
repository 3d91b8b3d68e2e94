"""Mixed precision: products in the compute dtype, the state and Euler update in float32.

Under `mixed_bfloat16` the increments `ε·f` (|ε·f| ≤ ε = 0.01) are below
bfloat16's spacing near 1 (2⁻⁷); a bfloat16 state rounds them away and drifts
from the float32 dynamics by several percent after 1000 steps. These tests
hold the layers and cells to the float64 NumPy reference (`benchmarks.reference`)
at T=1000 under every policy.
"""

import os

import keras
import numpy as np
import pytest
from keras import ops

from benchmarks import reference
from keras_antisym import (
    AntisymmetricCell,
    AntisymmetricRNN,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
    stability,
)

UNITS, FEATURES, BATCH, STEPS = 8, 3, 2, 1000
EPSILON, GAMMA = 0.01, 0.01
POLICIES = ["float32", "mixed_bfloat16", "mixed_float16"]
#: Relative error `‖h − h_ref‖ / ‖h_ref‖` of the state after `STEPS` steps, against
#: the float64 reference. The outputs leave the layer in the compute dtype, so the
#: bound includes one rounding of the output (2⁻⁹ relative for bfloat16, 2⁻¹² float16).
STATE_BOUND = {"float32": 1e-5, "mixed_bfloat16": 1e-2, "mixed_float16": 2e-3}
#: Relative error of the gradients of the weights (T=200), against float32's.
GRADIENT_BOUND = {"float32": 1e-5, "mixed_bfloat16": 5e-2, "mixed_float16": 1e-2}
COMPUTE = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
KINDS = ["fused", "cell"]


def make(kind, gated, policy, **kwargs):
    """The fused layer, or `keras.layers.RNN` of the cell, under `policy`."""
    arguments = dict(epsilon=EPSILON, gamma=GAMMA, dtype=policy)
    if kind == "fused":
        layer_class = GatedAntisymmetricRNN if gated else AntisymmetricRNN
        return layer_class(UNITS, **arguments, **kwargs)
    cell_class = GatedAntisymmetricCell if gated else AntisymmetricCell
    return keras.layers.RNN(cell_class(UNITS, **arguments), dtype=policy, **kwargs)


def inputs(steps=STEPS, seed=0):
    return np.random.RandomState(seed).standard_normal((BATCH, steps, FEATURES)).astype("float32")


def weights(gated, seed=1):
    """Weights of the paper's initialization (`N(0, 1/m)`, `N(0, 1/n)`), and a bias."""
    rng = np.random.RandomState(seed)
    blocks = 2 if gated else 1
    return [
        (rng.standard_normal((FEATURES, blocks * UNITS)) / np.sqrt(FEATURES)).astype("float32"),
        (rng.standard_normal(UNITS * (UNITS - 1) // 2) / np.sqrt(UNITS)).astype("float32"),
        (0.1 * rng.standard_normal(blocks * UNITS)).astype("float32"),
    ]


def built(kind, gated, policy, steps=STEPS, **kwargs):
    layer = make(kind, gated, policy, **kwargs)
    layer.build((BATCH, steps, FEATURES))
    layer.set_weights(weights(gated))
    return layer


def relative(got, want):
    got = np.asarray(ops.convert_to_numpy(ops.cast(got, "float32")), "float64")
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def expected(gated, x, h0=None):
    return reference.run(
        weights(gated), x, units=UNITS, epsilon=EPSILON, gamma=GAMMA, gated=gated, h0=h0
    )


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_state_after_1000_steps_matches_the_float64_reference(kind, gated, policy):
    """The drift of a bfloat16 state (~4% here) is what this bounds: the state is float32."""
    x = inputs()
    layer = built(kind, gated, policy)
    output = layer(x)
    assert keras.backend.standardize_dtype(output.dtype) == COMPUTE[policy]
    _, last = expected(gated, x)
    assert relative(output, last) < STATE_BOUND[policy]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_outputs_and_states_leave_in_the_compute_dtype(kind, gated):
    x = inputs(steps=20)
    layer = built(kind, gated, "mixed_bfloat16", steps=20, return_sequences=True, return_state=True)
    sequence, state = layer(x)
    assert keras.backend.standardize_dtype(sequence.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(state.dtype) == "bfloat16"
    outputs, last = expected(gated, x)
    assert relative(sequence, outputs) < STATE_BOUND["mixed_bfloat16"]
    # A state handed to another layer as its initial state enters it in float32.
    follow = built(kind, gated, "mixed_bfloat16", steps=20)
    y = follow(x, initial_state=[state])
    state64 = np.asarray(ops.convert_to_numpy(ops.cast(state, "float32")), "float64")
    _, want = expected(gated, x, h0=state64)
    assert relative(y, want) < STATE_BOUND["mixed_bfloat16"]


@pytest.mark.parametrize("gated", [False, True])
def test_the_cell_keeps_a_float32_state_and_runs_products_in_the_compute_dtype(gated):
    cell = (GatedAntisymmetricCell if gated else AntisymmetricCell)(
        UNITS, epsilon=EPSILON, gamma=GAMMA, dtype="mixed_bfloat16"
    )
    x = inputs(steps=1)[:, 0]
    h = np.full((BATCH, UNITS), 0.5, "float32")
    output, [state] = cell(x, [h])
    assert cell.compute_dtype == "float32"
    assert cell.product_dtype == "bfloat16"
    assert cell.variable_dtype == "float32"
    assert keras.backend.standardize_dtype(state.dtype) == "float32"
    assert keras.backend.standardize_dtype(cell.get_initial_state(BATCH)[0].dtype) == "float32"
    # The increment survives: 0.5 + ε·f is not rounded to bfloat16's spacing (2⁻⁸ at 0.5).
    increment = ops.convert_to_numpy(state) - h
    assert np.abs(increment).max() > 0
    assert not np.allclose(increment / (2.0**-8), np.round(increment / (2.0**-8)))


@pytest.mark.parametrize("gated", [False, True])
def test_a_stateful_layer_carries_its_state_over_in_float32(gated):
    """Ten calls of 100 steps give the state of one call of 1000 steps."""
    x = inputs()
    layer = make("fused", gated, "mixed_bfloat16", stateful=True)
    layer.build((BATCH, 100, FEATURES))
    layer.set_weights(weights(gated))
    for start in range(0, STEPS, 100):
        layer(x[:, start : start + 100])
    (variable,) = layer.states
    assert keras.backend.standardize_dtype(variable.dtype) == "float32"
    _, last = expected(gated, x)
    carried = np.asarray(ops.convert_to_numpy(variable), "float64")
    assert relative(carried, last) < STATE_BOUND["mixed_bfloat16"] / 2
    # Not rounded to bfloat16 at each call: the state of one call of 1000 steps.
    whole = make("fused", gated, "mixed_bfloat16", stateful=True)
    whole.build((BATCH, STEPS, FEATURES))
    whole.set_weights(weights(gated))
    whole(x)
    np.testing.assert_allclose(
        ops.convert_to_numpy(variable), ops.convert_to_numpy(whole.states[0]), atol=1e-5
    )


def gradients(layer, x, probe):
    """Gradients of `sum(layer(x) · probe)` with respect to the layer's weights, float64."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(layer(x), "float32") * probe)
        grads = tape.gradient(loss, layer.trainable_variables)
    elif backend == "jax":
        import jax

        values = [v.value for v in layer.trainable_variables]
        others = [v.value for v in layer.non_trainable_variables]

        def loss(values):
            out, _ = layer.stateless_call(values, others, x)
            return (out.astype("float32") * probe).sum()

        grads = jax.grad(loss)(values)
    else:
        import torch

        layer.zero_grad()
        out = layer(torch.as_tensor(x))
        (out.float() * torch.as_tensor(probe)).sum().backward()
        grads = [v.value.grad for v in layer.trainable_variables]
    return [np.asarray(ops.convert_to_numpy(ops.cast(g, "float32")), "float64") for g in grads]


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_float32(kind, gated, policy):
    steps = 200
    x = inputs(steps=steps)
    probe = np.random.RandomState(2).standard_normal((BATCH, UNITS)).astype("float32")
    want = gradients(built(kind, gated, "float32", steps=steps), x, probe)
    got = gradients(built(kind, gated, policy, steps=steps), x, probe)
    for g, w in zip(got, want, strict=True):
        assert np.linalg.norm(g - w) / np.linalg.norm(w) < GRADIENT_BOUND[policy]


@pytest.mark.parametrize("gated", [False, True])
def test_serialization_keeps_the_policy(gated, tmp_path):
    model = keras.Sequential(
        [keras.Input((50, FEATURES)), make("fused", gated, "mixed_bfloat16"),
         keras.layers.Dense(2, dtype="float32")]
    )  # fmt: skip
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    layer = loaded.layers[0]
    assert layer.dtype_policy.name == "mixed_bfloat16"
    assert layer.cell.dtype_policy.name == "mixed_bfloat16"
    assert layer.cell.compute_dtype == "float32"
    x = inputs(steps=50)
    np.testing.assert_array_equal(ops.convert_to_numpy(loaded(x)), ops.convert_to_numpy(model(x)))
    cell_layer = make("cell", gated, "mixed_float16")
    restored = keras.layers.deserialize(keras.layers.serialize(cell_layer))
    assert restored.cell.dtype_policy.name == "mixed_float16"
    assert restored.dtype_policy.name == "mixed_float16"


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_stability_analysis_reports_float64_under_a_mixed_policy(policy):
    x = inputs(steps=30)
    mixed = built("fused", True, policy, steps=30)
    full = built("fused", True, "float32", steps=30)
    mixed(x)
    full(x)
    got = stability.end_to_end_jacobian(mixed, x[0])
    want = stability.end_to_end_jacobian(full, x[0])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert stability.transition_matrix(mixed).dtype == np.float64
    np.testing.assert_allclose(
        stability.step_jacobian(mixed, np.zeros(UNITS), x[0, 0]),
        stability.step_jacobian(full, np.zeros(UNITS), x[0, 0]),
        atol=1e-6,
    )


def test_stability_diagnostics_run_under_a_mixed_policy():
    from keras_antisym import StabilityDiagnostics

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((30, FEATURES)), make("fused", False, "mixed_bfloat16"),
         keras.layers.Dense(2, dtype="float32")]
    )  # fmt: skip
    model.compile(optimizer="adam", loss="mse")
    x = inputs(steps=30)
    y = np.zeros((BATCH, 2), "float32")
    diagnostics = StabilityDiagnostics(every_n_steps=1, probe_data=(x, y))
    model.fit(x, y, epochs=1, verbose=0, callbacks=[diagnostics])
    (record,) = diagnostics.records
    assert len(record) > 3
    assert all(isinstance(v, (int, float)) and np.isfinite(v) for v in record.values())


# --- Training: --dtype-policy ---------------------------------------------------------------


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_dtype_policy_flag_reaches_the_model_and_float16_scales_the_loss(policy, tmp_path):
    """`--dtype-policy` builds the recurrent layer under the policy (head in float32),
    wraps the optimizer in a `LossScaleOptimizer` for float16 only, is recorded in
    `config.yaml` as a setting a resumed run keeps, and the run checkpoints and resumes."""
    from training import train
    from training.backends.strategies import TensorFlowBackend
    from training.config import RunConfig, identity_fields
    from training.run import experiment
    from training.tasks import catalog as tasks

    args = ["--task", "digits", "--model", "gated", "--units", "4", "--batch-size", "8",
            "--steps", "2", "--checkpoint-every", "1", "--log-every", "1",
            "--strategy", "default", "--dtype-policy", policy,
            "--output-dir", str(tmp_path)]  # fmt: skip
    config = RunConfig.from_namespace(train.build_parser().parse_args(args)).validate()
    assert config.model.dtype_policy == policy
    assert "dtype_policy" in identity_fields()
    task = tasks.get_task(config.task.name)
    splits = experiment.Splits.load(task, config)
    trainer = experiment.build_trainer(config, task, splits.train, TensorFlowBackend(),
                                       checkpoint_dir=str(tmp_path / "t"))  # fmt: skip
    recurrent, head = trainer.model.layers
    assert recurrent.dtype_policy.name == policy
    assert recurrent.cell.product_dtype == COMPUTE[policy]
    assert head.dtype_policy.name == "float32"
    scaled = isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    assert np.isfinite(trainer.step()[0])

    logs = []
    metrics = experiment.train_and_evaluate(config, str(tmp_path), log=logs.append)
    assert metrics["steps"] == 2 and np.isfinite(metrics["test_loss"])
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.layers[0].dtype_policy.name == policy
    resumed = experiment.train_and_evaluate(config.replace(steps=3), str(tmp_path), log=logs.append)
    assert resumed["steps"] == 3 and any("resumed" in line for line in logs)
    with pytest.raises(Exception, match="--dtype-policy"):
        experiment.train_and_evaluate(
            config.replace(steps=4, dtype_policy="float32"), str(tmp_path), log=logs.append
        )


def test_dtype_policy_flag_refuses_other_policies():
    from apputil.errors import UsageError
    from training.config import RunConfig

    with pytest.raises(UsageError, match="argument `dtype_policy`"):
        RunConfig.of(dtype_policy="float16").validate()


# --- Serving: the exported mixed-precision model answers in float32 --------------------------


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="exports on TensorFlow")
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_export_of_a_mixed_precision_model_serves_float32_outputs(policy, tmp_path):
    import tensorflow as tf

    from serving.exports.export import export_model
    from training.tasks import catalog as tasks
    from training.tasks import models

    spec = tasks.get_task("digits").spec
    full = models.build_model(spec, "gated", units=8, epsilon=0.1, seed=3)
    mixed = models.build_model(spec, "gated", units=8, epsilon=0.1, seed=3, dtype_policy=policy)
    mixed.set_weights(full.get_weights())
    path = str(tmp_path / "mixed.keras")
    mixed.save(path)
    version = export_model(path, str(tmp_path / "models"), 1)
    served = tf.saved_model.load(version).signatures["serving_default"]
    x = np.random.RandomState(0).rand(4, spec.timesteps, spec.features).astype("float32")
    answer = served(sequence=tf.constant(x))
    assert answer["logits"].dtype == tf.float32
    want = np.asarray(full(x))
    scale = np.abs(want).max()
    bound = 5e-2 if policy == "mixed_bfloat16" else 1e-2  # logits: the products' rounding
    np.testing.assert_allclose(answer["logits"].numpy(), want, atol=bound * scale)
    np.testing.assert_array_equal(answer["class_id"].numpy(), want.argmax(-1))


# --- Benchmark section ---------------------------------------------------------------------


def test_benchmark_times_every_policy_beside_float32():
    from benchmarks.run import QUICK, bench_precision
    from benchmarks.tables import precision_markdown, precision_ratios

    result = bench_precision({**QUICK, "repeats": 1, "warmup": 0}, layers=("AntisymmetricRNN",))
    assert set(result["times"]) == {f"AntisymmetricRNN|{p}" for p in POLICIES}
    assert set(precision_ratios(result)) == {
        "AntisymmetricRNN mixed_bfloat16/float32",
        "AntisymmetricRNN mixed_float16/float32",
    }
    assert "mixed_bfloat16" in "\n".join(precision_markdown(result))


# --- The fused kernel's bfloat16 input path (interpreted) -----------------------------------


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the Pallas kernel runs on JAX")
@pytest.mark.parametrize("gated", [False, True])
def test_fused_kernel_under_mixed_bfloat16_keeps_a_float32_state(gated, monkeypatch):
    """`fused_kernel=True` under mixed_bfloat16: bfloat16 projected inputs and operand,
    float32 state (interpret mode; the GPU measurement needs a GPU)."""
    from keras_antisym import kernels

    monkeypatch.setattr(kernels, "INTERPRET", True)
    steps = 40
    x = inputs(steps=steps)
    layer = built("fused", gated, "mixed_bfloat16", steps=steps, fused_kernel=True)
    used = []
    original = kernels.recurrence
    monkeypatch.setattr(
        kernels,
        "recurrence",
        lambda u, mt, *a, **k: used.append(u.dtype) or original(u, mt, *a, **k),
    )
    output = layer(x)
    assert [keras.backend.standardize_dtype(d) for d in used] == ["bfloat16"]
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    _, last = expected(gated, x)
    assert relative(output, last) < STATE_BOUND["mixed_bfloat16"]
    loop = built("fused", gated, "mixed_bfloat16", steps=steps)
    assert (
        relative(output, np.asarray(ops.convert_to_numpy(ops.cast(loop(x), "float32")), "float64"))
        < 1e-2
    )
