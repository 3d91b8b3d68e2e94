"""`training.tasks.models.build_model`: the layers, settings and names each model is built with."""

import types

import keras
import numpy as np
import pytest

import keras_antisym
from apputil.errors import UsageError
from training.tasks import models
from training.tasks.heads import HEADS


def _spec(head="classification", timesteps=7, features=3, num_outputs=5):
    return types.SimpleNamespace(
        name="toy", head=head, timesteps=timesteps, features=features, num_outputs=num_outputs
    )


@pytest.mark.parametrize(
    "model, cls, antisymmetric",
    [
        ("antisymmetric", keras_antisym.AntisymmetricRNN, True),
        ("gated", keras_antisym.GatedAntisymmetricRNN, True),
        ("ablation", keras_antisym.GatedAntisymmetricRNN, False),  # free W: the ablation
    ],
)
def test_each_antisymmetric_model_is_its_layer_with_the_run_s_settings(model, cls, antisymmetric):
    built = models.build_model(
        _spec(), model, units=4, epsilon=0.5, gamma=0.25, sigma_w=2.0, seed=3
    )
    assert built.name == f"{model}_toy"
    first = built.get_config()["layers"][0]
    assert first["class_name"] == "InputLayer"
    assert first["config"]["name"] == "sequence"
    assert tuple(first["config"]["batch_shape"]) == (None, 7, 3)
    rnn, head = built.layers
    assert type(rnn) is cls and rnn.name == model
    config = rnn.get_config()
    assert (config["units"], config["epsilon"], config["gamma"]) == (4, 0.5, 0.25)
    assert config["antisymmetric"] is antisymmetric and config["return_sequences"] is False
    # N(0, 1/m) for inputs, N(0, σ_w²/n) for the recurrent matrix, seeded apart.
    assert config["kernel_initializer"]["config"] == {"sigma": 1.0, "seed": 3}
    assert config["recurrent_initializer"]["config"] == {"sigma": 2.0, "seed": 4}
    assert head.name == "classification_head" and head.units == 5
    assert head.get_config()["kernel_initializer"]["config"]["seed"] == 3
    assert built(np.zeros((2, 7, 3), "float32")).shape == (2, 5)


def test_the_lstm_baseline_is_keras_lstm_with_forget_gate_bias_one():
    built = models.build_model(_spec(), "lstm", units=6, sigma_w=0.5, seed=0)
    rnn = built.layers[0]
    assert type(rnn) is keras.layers.LSTM and rnn.name == "lstm"
    config = rnn.get_config()
    assert config["units"] == 6 and config["unit_forget_bias"] is True
    assert config["recurrent_initializer"]["config"] == {"sigma": 0.5, "seed": 1}
    built(np.zeros((1, 7, 3), "float32"))
    bias = keras.ops.convert_to_numpy(rnn.cell.bias)
    np.testing.assert_array_equal(bias[6:12], 1.0)  # the forget gate's, of i, f, c, o
    np.testing.assert_array_equal(np.delete(bias, np.s_[6:12]), 0.0)


@pytest.mark.parametrize(
    "head, name, output_shape, sequences",
    [
        ("per_step_classification", "per_step_classification_head", (None, 7, 5), True),
        ("classification", "classification_head", (None, 5), False),
        ("regression", "regression_head", (None, 1), False),
    ],
)
def test_each_head_names_its_output_layer_and_shapes_the_output(
    head, name, output_shape, sequences
):
    spec = _spec(head=head, num_outputs=output_shape[-1])
    built = models.build_model(spec, "antisymmetric", units=4)
    assert built.layers[0].return_sequences is sequences
    assert built.layers[-1].name == name == HEADS[head].layer_name
    assert built(np.zeros((2, 7, 3), "float32")).shape == (2, *output_shape[1:])


def test_without_a_seed_the_initializers_are_unseeded_and_the_defaults_are_the_paper_s():
    built = models.build_model(_spec(), "antisymmetric")
    config = built.layers[0].get_config()
    assert config["kernel_initializer"]["config"] == {"sigma": 1.0, "seed": None}
    assert config["recurrent_initializer"]["config"] == {"sigma": 1.0, "seed": None}
    assert (config["units"], config["epsilon"], config["gamma"]) == (128, 0.01, 0.01)
    assert built.layers[1].get_config()["kernel_initializer"]["config"]["seed"] is None


def test_a_mixed_policy_runs_the_recurrence_in_it_and_keeps_the_head_in_float32():
    built = models.build_model(_spec(), "gated", units=4, dtype_policy="mixed_bfloat16")
    rnn, head = built.layers
    assert rnn.dtype_policy.name == "mixed_bfloat16"
    assert head.dtype_policy.name == "float32"
    assert built(np.zeros((2, 7, 3), "float32")).dtype == "float32"
    # The head stays in float32 under a global mixed policy too (the docstring's promise).
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = models.build_model(_spec(), "gated", units=4, dtype_policy="mixed_bfloat16")
    finally:
        keras.config.set_dtype_policy(policy)
    assert mixed.layers[1].dtype_policy.name == "float32"
    plain = models.build_model(_spec(), "gated", units=4)  # the global policy for both
    assert [layer.dtype_policy.name for layer in plain.layers] == ["float32", "float32"]


def test_an_unknown_model_or_head_is_refused_naming_the_known_ones():
    with pytest.raises(UsageError) as refused:
        models.build_model(_spec(), "gru")
    assert str(refused.value) == (
        "Received an invalid value for argument `model`, expected one of antisymmetric, "
        "gated, ablation, lstm, got 'gru'."
    )
    with pytest.raises(UsageError) as refused:
        models.build_model(_spec(head="ranking"), "lstm")
    assert str(refused.value) == (
        "Received an invalid value for argument `spec`, expected a head in classification, "
        "regression, per_step_classification, got 'ranking'."
    )
