"""Run by test_backends.py in a subprocess with KERAS_BACKEND set.

Reads inputs and weights from an .npz, writes every configuration's outputs,
the loss history of a short `fit`, and a `.keras` round trip to another .npz.
"""

import os
import sys
import tempfile

import keras
import numpy as np

from keras_antisym._keras_private import accelerator_available
from tests.conftest import make_layer

CASES = [
    # name, kind, gated, layer kwargs, masked, input features (>= 8: hoisted V·x)
    ("cell_plain", "cell", False, {}, False, 4),
    ("fused_plain", "fused", False, {}, False, 4),
    ("fused_plain_hoisted", "fused", False, {}, False, 9),
    ("cell_gated", "cell", True, {}, False, 4),
    ("fused_gated", "fused", True, {}, False, 4),
    ("cell_gated_mask_back", "cell", True, {"go_backwards": True}, True, 4),
    ("fused_gated_mask_back", "fused", True, {"go_backwards": True}, True, 4),
    ("fused_gated_mask_back_hoisted", "fused", True, {"go_backwards": True}, True, 9),
    ("fused_plain_mask_unroll", "fused", False, {"unroll": True}, True, 4),
    ("fused_ablation", "fused", True, {"antisymmetric": False}, False, 4),
]


def main(in_path, out_path):
    data = np.load(in_path)
    mask = data["mask"]
    results = {
        "backend": np.array(keras.backend.backend()),
        "accelerator": np.array(accelerator_available()),
    }
    for name, kind, gated, kwargs, masked, features in CASES:
        x = data[f"x{features}"]
        # Cases with >= 8 features take the hoisted path, as on a GPU.
        kwargs = {**kwargs, "hoist_inputs": features >= 8}
        layer = make_layer(kind, gated, 5, epsilon=0.3, gamma=0.05, return_sequences=True, **kwargs)
        layer(x)
        layer.set_weights([data[f"{name}_w{i}"] for i in range(len(layer.weights))])
        y = layer(x, mask=mask if masked else None)
        results[name] = keras.ops.convert_to_numpy(y)

    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    xs = rng.standard_normal((64, 12, 2)).astype("float32")
    ys = (xs[:, :3, 0].sum(1) > 0).astype("int32")
    for kind in ("cell", "fused"):
        model = keras.Sequential(
            [
                keras.Input((12, 2)),
                make_layer(kind, True, 16, epsilon=0.5, dropout=0.1, recurrent_dropout=0.1, seed=1),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            keras.optimizers.Adam(0.02),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        history = model.fit(xs, ys, epochs=12, batch_size=32, verbose=0).history["loss"]
        results[f"{kind}_fit_loss"] = np.array(history)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.keras")
            model.save(path)
            loaded = keras.saving.load_model(path)
        results[f"{kind}_roundtrip"] = np.array(
            [keras.ops.convert_to_numpy(model(xs)), keras.ops.convert_to_numpy(loaded(xs))]
        )
    # Stateful training: the loop must not hold the state variables' tensors
    # (torch autograd fails on their in-place update otherwise).
    for kind in ("cell", "fused"):
        model = keras.Sequential(
            [
                keras.Input(batch_shape=(16, 12, 2)),
                make_layer(kind, False, 8, epsilon=0.5, stateful=True),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        before = [w.copy() for w in model.get_weights()]
        history = model.fit(xs, ys, epochs=3, batch_size=16, shuffle=False, verbose=0)
        results[f"{kind}_stateful_loss"] = np.array(history.history["loss"])
        results[f"{kind}_stateful_update"] = np.array(
            sum(
                float(np.abs(a - b).sum()) for a, b in zip(model.get_weights(), before, strict=True)
            )
        )
    # Stateful carry-over: the second chunk continues from the first chunk's last state.
    rng = np.random.RandomState(11)
    x = rng.standard_normal((2, 8, 3)).astype("float32")
    for kind in ("cell", "fused"):
        layer = make_layer(kind, True, 5, epsilon=0.3, gamma=0.02, stateful=True)
        model = keras.Sequential([keras.Input(batch_shape=(2, 4, 3)), layer])
        weights = [
            0.6 * rng.standard_normal(w.shape).astype("float32") for w in layer.get_weights()
        ]
        layer.set_weights(weights)
        model(x[:, :4])
        continued = keras.ops.convert_to_numpy(model(x[:, 4:]))
        layer.reset_states()
        fresh = keras.ops.convert_to_numpy(model(x[:, 4:]))
        results[f"{kind}_stateful_carry"] = np.array([continued, fresh])
        results[f"{kind}_stateful_weights"] = np.concatenate([w.ravel() for w in weights])
    np.savez(out_path, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
