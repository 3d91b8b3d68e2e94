"""The paper's models: an RNN over the sequence and a Dense head on its last state."""

import keras

import keras_antisym

MODEL_NAMES = ("antisymmetric", "gated", "ablation", "lstm")


def build_model(spec, model, units=128, epsilon=0.01, gamma=0.01, sigma_w=1.0, seed=None):
    """The model `model` for the task `spec` (a `training.tasks.TaskSpec`).

    Args:
        spec: The task's shapes and head.
        model: "antisymmetric", "gated", "ablation" (gated with a free
            recurrent matrix) or "lstm" (Keras LSTM, forget-gate bias 1).
        units: Hidden units.
        epsilon, gamma: Step size and diffusion of the antisymmetric models.
        sigma_w: Scale of the hidden-to-hidden initialization `N(0, σ_w²/n)`
            (the input-to-hidden one is `N(0, 1/m)`, as in the paper).
        seed: Seed of the initializers.

    Returns:
        An uncompiled `keras.Model` from `(batch, T, m)` float32 to logits
        (`(batch, classes)`, `(batch, T, classes)` for sequence heads) or a
        regression value `(batch, 1)`.
    """
    if model not in MODEL_NAMES:
        raise ValueError(
            f"Received an invalid value for argument `model`, expected one of "
            f"{', '.join(MODEL_NAMES)}, got {model!r}."
        )
    sequence_head = spec.head == "sequence"
    seeds = (None, None) if seed is None else (seed, seed + 1)
    initializers = dict(
        kernel_initializer=keras_antisym.FanInNormal(1.0, seed=seeds[0]),
        recurrent_initializer=keras_antisym.FanInNormal(sigma_w, seed=seeds[1]),
    )
    if model == "lstm":
        rnn = keras.layers.LSTM(
            units,
            unit_forget_bias=True,
            return_sequences=sequence_head,
            name="lstm",
            **initializers,
        )
    else:
        layer_class = (
            keras_antisym.AntisymmetricRNN
            if model == "antisymmetric"
            else keras_antisym.GatedAntisymmetricRNN
        )
        rnn = layer_class(
            units,
            epsilon=epsilon,
            gamma=gamma,
            antisymmetric=model != "ablation",
            return_sequences=sequence_head,
            name=model,
            **initializers,
        )
    head = keras.layers.Dense(
        spec.num_outputs,
        name="head",
        kernel_initializer=keras.initializers.GlorotUniform(seed=seed),
    )
    return keras.Sequential(
        [keras.Input((spec.timesteps, spec.features), name="sequence"), rnn, head],
        name=f"{model}_{spec.name}",
    )
