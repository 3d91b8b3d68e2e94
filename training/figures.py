"""The paper's dynamics figures and Jacobian eigenvalue study (Chang et al., ICLR 2019).

- Figure 1 and appendix figures (Section 4, Appendix C): two-dimensional
  vanilla RNNs `h_t = tanh(W h_{t-1})` and RNNs with feedback
  `h_t = h_{t-1} + ε·tanh(W h_{t-1})` (ε = 0.1, T = 50) from the paper's
  three initial states; seed grids; feedback with Gaussian input.
- Figure 2: mean and standard deviation of the eigenvalue magnitudes of the
  end-to-end Jacobian `∂h_T/∂h_0` of LSTMs and AntisymmetricRNNs with
  several diffusions `γ`, on noise-padded inputs of lengths T.

Writes PNGs and the plotted numbers as `figures.json`:

    python -m training.figures --output-dir figures/
    python -m training.figures --which jacobian --paper-sizes --samples 8
    python -m training.figures --which jacobian --checkpoints run/model.keras

Figure 2 defaults to small models at initialization (CPU: about a minute).
No CIFAR-10 is downloaded: the 32 "image rows" are random uniform pixels,
standardized, followed by standard Gaussian noise up to T steps (the
noise-padded CIFAR-10 layout: m = 96 = 32 pixels × 3 channels per step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import keras
import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from apputil.cli import execute
from apputil.errors import invalid
from keras_antisym import (
    AntisymmetricCell,
    AntisymmetricRNN,
    FanInNormal,
    diagnostics,
)

INITIAL_STATES = np.array([[0.0, 0.5], [-0.5, -0.5], [0.5, -0.75]])
EPSILON = 0.1
STEPS = 50
GAMMA_DIFF = 0.15

FEEDBACK_MATRICES = {
    "W+": np.array([[2.0, -2.0], [0.0, 2.0]]),
    "W-": np.array([[-2.0, 2.0], [0.0, -2.0]]),
    "W0": np.array([[0.0, -2.0], [2.0, 0.0]]),
    "Wdiff": np.array([[0.0, -2.0], [2.0, 0.0]]) - GAMMA_DIFF * np.eye(2),
}
FEEDBACK_TITLES = {
    "W+": "feedback W+, λ = 2, 2",
    "W-": "feedback W-, λ = -2, -2",
    "W0": "feedback W0, λ = ±2i",
    "Wdiff": "feedback Wdiff, λ = -0.15 ± 2i",
}
COLORS = ["tab:blue", "tab:orange", "tab:green"]


def random_orthogonal(seed, determinant):
    """A random 2x2 orthogonal matrix with the given determinant (±1)."""
    q, r = np.linalg.qr(np.random.RandomState(seed).standard_normal((2, 2)))
    q = q * np.sign(np.diag(r))
    if np.sign(np.linalg.det(q)) != determinant:
        q[:, 0] = -q[:, 0]
    return q


def vanilla_matrices():
    """Figure 1(a)-(d): random Gaussian, identity, reflection, rotation."""
    return {
        "random": np.random.RandomState(0).standard_normal((2, 2)),
        "identity": np.eye(2),
        "reflection": random_orthogonal(0, -1.0),
        "rotation": random_orthogonal(1, 1.0),
    }


def vanilla_trajectory(w, h0, steps=STEPS):
    """`h_t = tanh(W h_{t-1})`: an array `(steps + 1, 2)` starting at `h0`."""
    states = [np.asarray(h0, float)]
    for _ in range(steps):
        states.append(np.tanh(w @ states[-1]))
    return np.array(states)


def feedback_trajectory(w, h0, steps=STEPS, epsilon=EPSILON, inputs=None):
    """`h_t = h_{t-1} + ε·tanh(W h_{t-1} + x_t)`; `inputs` `(steps, 2)` or None."""
    states = [np.asarray(h0, float)]
    for t in range(steps):
        drive = w @ states[-1] + (0.0 if inputs is None else inputs[t])
        states.append(states[-1] + epsilon * np.tanh(drive))
    return np.array(states)


def trajectory_numbers(w, trajectories):
    norms = [np.linalg.norm(traj, axis=-1) for traj in trajectories]
    eig = np.linalg.eigvals(w)
    return {
        "matrix": w.tolist(),
        "eigenvalues": [[float(e.real), float(e.imag)] for e in eig],
        "initial_norm": [float(n[0]) for n in norms],
        "final_norm": [float(n[-1]) for n in norms],
        "norm_ratio": [float(n[-1] / n[0]) for n in norms],
        "max_norm": [float(n.max()) for n in norms],
        "min_norm": [float(n.min()) for n in norms],
        "final_state": [traj[-1].tolist() for traj in trajectories],
    }


def _plot_trajectories(ax, trajectories, title, w=None, limit=None):
    for traj, color in zip(trajectories, COLORS, strict=False):
        rgba = np.tile(to_rgba(color), (len(traj), 1))
        rgba[:, 3] = np.linspace(0.1, 1.0, len(traj))  # earlier: more translucent
        ax.scatter(traj[:, 0], traj[:, 1], c=rgba, s=6, linewidths=0)
        ax.scatter(*traj[0], marker="*", s=60, color=color, edgecolors="k", linewidths=0.4)
    limit = limit or max(1.0, 1.1 * max(np.abs(traj).max() for traj in trajectories))
    if w is not None:  # the vector field of the ODE h' = tanh(W h)
        grid = np.linspace(-limit, limit, 13)
        gx, gy = np.meshgrid(grid, grid)
        field = np.tanh(np.einsum("ij,jab->iab", w, np.stack([gx, gy])))
        ax.quiver(gx, gy, field[0], field[1], color="0.6", width=0.004, scale=25)
    ax.set_xlim(-limit, limit)
    ax.set_ylim(-limit, limit)
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=7)
    ax.tick_params(labelsize=5)


def dynamics_figures(output_dir, grid_seeds=16, input_seed=0, dpi=80):
    """Figure 1, the two seed grids and the with-input panel; returns the numbers."""
    numbers = {"epsilon": EPSILON, "steps": STEPS, "initial_states": INITIAL_STATES.tolist()}
    fig = Figure(figsize=(8, 4.3))
    axes = fig.subplots(2, 4)
    numbers["vanilla"] = {}
    for ax, (name, w) in zip(axes[0], vanilla_matrices().items(), strict=True):
        trajs = [vanilla_trajectory(w, h0) for h0 in INITIAL_STATES]
        numbers["vanilla"][name] = trajectory_numbers(w, trajs)
        _plot_trajectories(ax, trajs, f"vanilla, {name} W", limit=1.1)
    numbers["feedback"] = {}
    for ax, (name, w) in zip(axes[1], FEEDBACK_MATRICES.items(), strict=True):
        trajs = [feedback_trajectory(w, h0) for h0 in INITIAL_STATES]
        numbers["feedback"][name] = trajectory_numbers(w, trajs)
        _plot_trajectories(ax, trajs, FEEDBACK_TITLES[name], w=w)
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "figure1_dynamics.png"), dpi=dpi)

    side = int(np.ceil(np.sqrt(grid_seeds)))
    for kind in ("vanilla", "feedback"):
        fig = Figure(figsize=(1.6 * side, 1.6 * side))
        axes = fig.subplots(side, side, squeeze=False)
        numbers[f"{kind}_seeds"] = {}
        for ax, seed in zip(axes.ravel(), range(1, grid_seeds + 1), strict=False):
            a = np.random.RandomState(seed).standard_normal((2, 2))
            if kind == "vanilla":
                w = a
                trajs = [vanilla_trajectory(w, h0) for h0 in INITIAL_STATES]
            else:  # Appendix: antisymmetric Gaussian weights, diffusion γ = 0.1
                w = a - a.T - 0.1 * np.eye(2)
                trajs = [feedback_trajectory(w, h0) for h0 in INITIAL_STATES]
            numbers[f"{kind}_seeds"][str(seed)] = trajectory_numbers(w, trajs)
            _plot_trajectories(ax, trajs, f"seed {seed}", w=None if kind == "vanilla" else w)
        for ax in axes.ravel()[grid_seeds:]:
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(os.path.join(output_dir, f"appendix_{kind}_seeds.png"), dpi=dpi)

    # Appendix: feedback with independent standard Gaussian input (V = I).
    inputs = np.random.RandomState(input_seed).standard_normal((len(INITIAL_STATES), STEPS, 2))
    fig = Figure(figsize=(8, 2.3))
    axes = fig.subplots(1, 4)
    numbers["feedback_with_input"] = {"input_seed": input_seed}
    for ax, (name, w) in zip(axes, FEEDBACK_MATRICES.items(), strict=True):
        trajs = [
            feedback_trajectory(w, h0, inputs=inputs[i]) for i, h0 in enumerate(INITIAL_STATES)
        ]
        numbers["feedback_with_input"][name] = trajectory_numbers(w, trajs)
        _plot_trajectories(ax, trajs, f"{FEEDBACK_TITLES[name]}, + input", w=w)
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "appendix_feedback_with_input.png"), dpi=dpi)
    return numbers


def noise_padded_inputs(samples, steps, input_dim=96, image_rows=32, seed=0):
    """`(samples, steps, input_dim)`: standardized uniform "image rows", then N(0, 1) noise."""
    rng = np.random.RandomState(seed)
    rows = min(image_rows, steps)
    image = (rng.uniform(0.0, 1.0, (samples, rows, input_dim)) - 0.5) * np.sqrt(12.0)
    noise = rng.standard_normal((samples, steps - rows, input_dim))
    return np.concatenate([image, noise], axis=1).astype("float32")


def lstm_end_to_end_jacobian(layer, sequences):
    """`∂h_T/∂h_0` (with `c_0` fixed) of a Keras LSTM, by TensorFlow autodiff.

    Per step, `tf.GradientTape.batch_jacobian` of `(h_t, c_t)` with respect to
    `(h_{t-1}, c_{t-1})`; the `2n x 2n` step Jacobians are multiplied in float64
    and the `h`-to-`h` block of the product is returned, `(batch, n, n)`.
    """
    import tensorflow as tf  # training/ may use TensorFlow; LSTM autodiff only

    cell = layer.cell
    units = cell.units

    @tf.function
    def step(state, x, product):
        with tf.GradientTape() as tape:
            tape.watch(state)
            _, (h, c) = cell(x, [state[:, :units], state[:, units:]])
            new_state = tf.concat([h, c], axis=-1)
        jac = tf.cast(tape.batch_jacobian(new_state, state), tf.float64)
        return new_state, tf.matmul(jac, product)

    x = tf.constant(sequences, tf.float32)
    batch = x.shape[0]
    state = tf.zeros((batch, 2 * units))
    product = tf.eye(2 * units, batch_shape=[batch], dtype=tf.float64)
    for t in range(x.shape[1]):
        state, product = step(state, x[:, t], product)
    return product.numpy()[:, :units, :units]


def _stats(jac):
    stats = diagnostics.eigenvalue_magnitude_stats(jac)
    return {
        "mean": stats["eig_abs_mean"],
        "std": stats["eig_abs_std"],
        "sv_max": stats["sv_max"],
        "sv_min": stats["sv_min"],
    }


def make_lstm(units, input_dim):
    """The paper's LSTM initialization: N(0, 1/m), N(0, 1/n), forget bias 1."""
    layer = keras.layers.LSTM(
        units,
        kernel_initializer=FanInNormal(1.0),
        recurrent_initializer=FanInNormal(1.0),
        unit_forget_bias=True,
    )
    layer.build((None, None, input_dim))
    return layer


def jacobian_study(args):
    """Figure 2's numbers at initialization: `{model: {T: {mean, std, ...}}}`."""
    lengths = args.lengths
    x = noise_padded_inputs(args.samples, max(lengths), args.input_dim, args.image_rows, args.seed)
    keras.utils.set_random_seed(args.seed)
    results = {}
    lstm = make_lstm(args.lstm_units, args.input_dim)
    results["LSTM"] = {str(t): _stats(lstm_end_to_end_jacobian(lstm, x[:, :t])) for t in lengths}
    for gamma in args.gammas:
        keras.utils.set_random_seed(args.seed)
        layer = AntisymmetricRNN(args.units, epsilon=args.epsilon, gamma=gamma)
        layer.build((None, None, args.input_dim))
        results[f"AntisymmetricRNN gamma={gamma:g}"] = {
            str(t): _stats(diagnostics.end_to_end_jacobian(layer, x[:, :t])) for t in lengths
        }
    return {
        "setting": "initialization",
        "epsilon": args.epsilon,
        "units": args.units,
        "lstm_units": args.lstm_units,
        "samples": args.samples,
        "input_dim": args.input_dim,
        "lengths": lengths,
        "gammas": args.gammas,
        "models": results,
    }


def checkpoint_study(paths, args):
    """Figure 2's numbers for trained `.keras` checkpoints (first recurrent layer)."""
    results = {}
    for path in paths:
        model = keras.saving.load_model(path, compile=False)
        layer = next(
            (
                lay
                for lay in model.layers
                if isinstance(lay, keras.layers.LSTM)
                or isinstance(getattr(lay, "cell", None), AntisymmetricCell)
            ),
            None,
        )
        if layer is None:
            results[path] = {"error": "no LSTM or Antisymmetric layer"}
            continue
        _, steps, input_dim = model.input_shape
        lengths = [steps] if steps is not None else args.lengths
        x = noise_padded_inputs(args.samples, max(lengths), input_dim, args.image_rows, args.seed)
        inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
        layer_inputs = keras.ops.convert_to_numpy(keras.Model(inputs, layer.input)(x))
        entry = {"layer": layer.name, "type": type(layer).__name__}
        for t in lengths:
            seq = layer_inputs[:, :t]
            if isinstance(layer, keras.layers.LSTM):
                jac = lstm_end_to_end_jacobian(layer, seq)
            else:
                jac = diagnostics.end_to_end_jacobian(layer, seq)
            entry[str(t)] = _stats(jac)
        results[path] = entry
    return results


def plot_jacobian_study(study, path, dpi=80):
    fig = Figure(figsize=(8, 3))
    axes = fig.subplots(1, 2)
    lengths = study["lengths"]
    for name, per_length in study["models"].items():
        means = [per_length[str(t)]["mean"] for t in lengths]
        stds = [per_length[str(t)]["std"] for t in lengths]
        style = "k--o" if name == "LSTM" else "-o"
        label = name.replace("AntisymmetricRNN gamma=", "γ=")
        axes[0].plot(lengths, means, style, label=label, markersize=3)
        axes[1].plot(lengths, stds, style, label=label, markersize=3)
    for ax, what in zip(axes, ("mean", "standard deviation"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(t) for t in lengths])
        ax.set_xlabel("time steps T")
        ax.set_title(f"{what} of |eigenvalues| of ∂h_T/∂h_0", fontsize=8)
    axes[0].axhline(1.0, color="0.8", lw=0.8)
    axes[1].legend(fontsize=6)
    fig.suptitle(
        f"At initialization: AntisymmetricRNN n={study['units']}, ε={study['epsilon']:g}; "
        f"LSTM n={study['lstm_units']}; {study['samples']} noise-padded sequences",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)


def _csv(cast):
    return lambda text: [cast(part) for part in text.split(",") if part]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", default="figures")
    parser.add_argument("--which", type=_csv(str), default=["dynamics", "jacobian"])
    parser.add_argument("--checkpoints", nargs="*", default=[])
    parser.add_argument("--units", type=int, default=32, help="AntisymmetricRNN units")
    parser.add_argument("--lstm-units", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--lengths", type=_csv(int), default=[100, 200, 400, 800])
    parser.add_argument("--gammas", type=_csv(float), default=[0.001, 0.01, 0.1, 1, 5, 10])
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--input-dim", type=int, default=96)
    parser.add_argument("--image-rows", type=int, default=32)
    parser.add_argument("--grid-seeds", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dpi", type=int, default=80)
    parser.add_argument(
        "--paper-sizes", action="store_true", help="LSTM 128 and AntisymmetricRNN 256 units"
    )
    args = parser.parse_args(argv)
    unknown = set(args.which) - {"dynamics", "jacobian"}
    if unknown:
        expected = "a comma-separated subset of dynamics,jacobian"
        parser.error(str(invalid("--which", expected, ",".join(sorted(unknown)))))
    if args.paper_sizes:
        args.units, args.lstm_units = 256, 128
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    numbers = {}
    if "dynamics" in args.which:
        numbers["dynamics"] = dynamics_figures(args.output_dir, args.grid_seeds, dpi=args.dpi)
    if "jacobian" in args.which:
        study = jacobian_study(args)
        plot_jacobian_study(study, os.path.join(args.output_dir, "figure2_jacobian.png"), args.dpi)
        numbers["jacobian"] = study
    if args.checkpoints:
        numbers["checkpoints"] = checkpoint_study(args.checkpoints, args)
    path = os.path.join(args.output_dir, "figures.json")
    with open(path, "w") as f:
        json.dump(numbers, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    execute(main)
