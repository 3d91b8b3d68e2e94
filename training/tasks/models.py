"""The paper's models: an RNN over the sequence and a Dense head on its last state.

The output layer is named for its head (`training.tasks.heads.Head.layer_name`), so a
saved `.keras` file records what its outputs mean wherever it is copied: the exporter
reads the name back to choose the serving signature.
"""

from __future__ import annotations

from typing import Any

import keras

import keras_antisym
from apputil.errors import invalid
from training.config import MODEL_NAMES
from training.tasks.heads import HEADS


def build_model(
    spec: Any,
    model: str,
    units: int = 128,
    epsilon: float = 0.01,
    gamma: float = 0.01,
    sigma_w: float = 1.0,
    seed: int | None = None,
    dtype_policy: str | None = None,
) -> keras.Model:
    """The model `model` for the task `spec` (a `training.tasks.catalog.TaskSpec`).

    Args:
        spec: The task's shapes and head.
        model: "antisymmetric", "gated", "ablation" (gated with a free
            recurrent matrix) or "lstm" (Keras LSTM, forget-gate bias 1).
        units: Hidden units.
        epsilon, gamma: Step size and diffusion of the antisymmetric models.
        sigma_w: Scale of the hidden-to-hidden initialization `N(0, σ_w²/n)`
            (the input-to-hidden one is `N(0, 1/m)`, as in the paper).
        seed: Seed of the initializers.
        dtype_policy: The recurrent layer's Keras dtype policy (None: the
            global one). The head always computes in float32: under a mixed
            policy the logits and the loss stay in float32, as Keras'
            mixed-precision guide recommends.

    Returns:
        An uncompiled `keras.Model` from `(batch, T, m)` float32 to logits
        (`(batch, classes)`, `(batch, T, classes)` for sequence heads) or a
        regression value `(batch, 1)`; its output layer is named
        for its head (`training.tasks.heads.Head.layer_name`).
    """
    if model not in MODEL_NAMES:
        raise invalid("model", f"one of {', '.join(MODEL_NAMES)}", model)
    if spec.head not in HEADS:
        raise invalid("spec", f"a head in {', '.join(HEADS)}", spec.head)
    head_kind = HEADS[spec.head]
    seeds = (None, None) if seed is None else (seed, seed + 1)
    rnn = _recurrent_layer(
        model,
        units,
        return_sequences=head_kind.per_step,
        kernel_initializer=keras_antisym.FanInNormal(1.0, seed=seeds[0]),
        recurrent_initializer=keras_antisym.FanInNormal(sigma_w, seed=seeds[1]),
        epsilon=epsilon,
        gamma=gamma,
        dtype=dtype_policy,
    )
    head = keras.layers.Dense(
        spec.num_outputs,
        name=head_kind.layer_name,
        kernel_initializer=keras.initializers.GlorotUniform(seed=seed),
        dtype=None if dtype_policy is None else "float32",
    )
    return keras.Sequential(
        [keras.Input((spec.timesteps, spec.features), name="sequence"), rnn, head],
        name=f"{model}_{spec.name}",
    )


def _recurrent_layer(model, units, epsilon, gamma, **kwargs):
    """The recurrent layer of `model`, named after it."""
    if model == "lstm":
        return keras.layers.LSTM(units, unit_forget_bias=True, name="lstm", **kwargs)
    layer_class = (
        keras_antisym.AntisymmetricRNN
        if model == "antisymmetric"
        else keras_antisym.GatedAntisymmetricRNN
    )
    return layer_class(
        units,
        epsilon=epsilon,
        gamma=gamma,
        antisymmetric=model != "ablation",
        name=model,
        **kwargs,
    )
