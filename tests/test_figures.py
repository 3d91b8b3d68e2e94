"""training/figures.py runs headless and its numbers show what the paper states."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_antisym import AntisymmetricRNN
from tests.helpers import record_figures
from tests.limits import limit
from training import figures

ROOT = Path(__file__).resolve().parents[1]
PNGS = [
    "figure1_dynamics.png",
    "appendix_vanilla_seeds.png",
    "appendix_feedback_seeds.png",
    "appendix_feedback_with_input.png",
    "figure2_jacobian.png",
]
LENGTHS = [25, 50, 100]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    # A small "trained" checkpoint: its input length fixes T.
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((40, 5)), AntisymmetricRNN(8, epsilon=0.01, gamma=0.01), keras.layers.Dense(3)]
    )
    checkpoint = str(out / "model.keras")
    model.save(checkpoint)
    args = ["--output-dir", str(out), "--grid-seeds", "4", "--samples", "2", "--units", "16"]
    args += ["--lstm-units", "16", "--lengths", ",".join(map(str, LENGTHS))]
    args += ["--gammas", "0.001,10", "--checkpoints", checkpoint]
    status = figures.main(args)  # in this process: its numbers are checked below
    return out, json.loads((out / "figures.json").read_text()), status


def test_main_exits_with_status_0(outputs):
    assert outputs[2] == 0


def test_runs_headless():
    """No display on training machines: a fresh interpreter plots with Agg, `DISPLAY` unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "MPLBACKEND")}
    code = "import training.figures, matplotlib; print(matplotlib.get_backend())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=limit(120))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().lower() == "agg"


def test_flags_defaults_and_refusals(capsys):
    args = figures.parse_args([])
    assert (args.output_dir, args.checkpoints) == ("figures", [])
    assert args.which == ["dynamics", "jacobian"]
    assert (args.units, args.lstm_units, args.samples, args.epsilon) == (32, 32, 4, 0.01)
    assert args.lengths == [100, 200, 400, 800] and args.gammas == [0.001, 0.01, 0.1, 1, 5, 10]
    assert (args.input_dim, args.image_rows, args.grid_seeds, args.seed, args.dpi) == (
        96,
        32,
        16,
        0,
        80,
    )
    typed = figures.parse_args(["--epsilon", "0.5", "--input-dim", "7", "--seed", "3"])
    assert (typed.epsilon, typed.input_dim, typed.seed) == (0.5, 7, 3)
    assert [type(v) for v in (typed.epsilon, typed.input_dim, typed.seed)] == [float, int, int]
    paper = figures.parse_args(["--paper-sizes", "--units", "8", "--which", "jacobian,"])
    assert (paper.units, paper.lstm_units, paper.which) == (256, 128, ["jacobian"])
    with pytest.raises(SystemExit) as refused:
        figures.parse_args(["--which", "dynamics,speed,noise"])
    assert refused.value.code == 2
    assert (
        "Received an invalid value for argument `--which`, expected a comma-separated subset "
        "of dynamics,jacobian, got 'noise,speed'"
    ) in capsys.readouterr().err


def test_writes_non_empty_pngs(outputs):
    out, *_ = outputs
    for name in PNGS:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_feedback_dynamics_follow_the_eigenvalues(outputs):
    feedback = outputs[1]["dynamics"]["feedback"]
    # Paper: "moving away from the origin" (W+), "towards the origin" (W-).
    assert min(feedback["W+"]["norm_ratio"]) > 5
    assert max(feedback["W-"]["final_norm"]) < 1e-3
    # W0: an outward spiral (Proposition 2); Wdiff: near-constant distance.
    assert min(feedback["W0"]["norm_ratio"]) > 1.25
    ratios = np.array(feedback["Wdiff"]["norm_ratio"])
    assert np.all(np.abs(ratios - 1) < 0.1), ratios
    spread = np.array(feedback["Wdiff"]["max_norm"]) / np.array(feedback["Wdiff"]["min_norm"])
    assert np.all(spread < 1.2), spread
    eig = {name: sorted(map(tuple, feedback[name]["eigenvalues"])) for name in feedback}
    np.testing.assert_allclose(eig["W+"], [(2, 0), (2, 0)], atol=1e-6)
    np.testing.assert_allclose(eig["W-"], [(-2, 0), (-2, 0)], atol=1e-6)
    np.testing.assert_allclose(eig["W0"], [(0, -2), (0, 2)], atol=1e-9)
    np.testing.assert_allclose(eig["Wdiff"], [(-0.15, -2), (-0.15, 2)], atol=1e-9)


def test_vanilla_orthogonal_and_identity_contract(outputs):
    vanilla = outputs[1]["dynamics"]["vanilla"]
    for name in ("identity", "reflection", "rotation"):
        initial = np.array(vanilla[name]["initial_norm"])
        assert np.all(np.array(vanilla[name]["final_norm"]) < 0.5 * initial), name
    determinants = {n: np.linalg.det(np.array(vanilla[n]["matrix"])) for n in vanilla}
    assert determinants["reflection"] == pytest.approx(-1) and determinants["rotation"] == (
        pytest.approx(1)
    )
    assert len(outputs[1]["dynamics"]["feedback_seeds"]) == 4


def test_jacobian_eigenvalues_small_gamma_near_one_lstm_and_large_gamma_vanish(outputs):
    models = outputs[1]["jacobian"]["models"]
    small = models["AntisymmetricRNN gamma=0.001"]
    for t in LENGTHS:
        assert 0.9 < small[str(t)]["mean"] < 1.1 and small[str(t)]["std"] < 0.1, small
    for name in ("LSTM", "AntisymmetricRNN gamma=10"):
        means = [models[name][str(t)]["mean"] for t in LENGTHS]
        assert all(a > b for a, b in zip(means, means[1:], strict=False)), (name, means)
        assert means[-1] < 1e-2, (name, means)


def test_checkpoint_entry(outputs):
    (entry,) = outputs[1]["checkpoints"].values()
    assert entry["type"] == "AntisymmetricRNN" and set(entry) >= {"40"}
    assert 0.8 < entry["40"]["mean"] < 1.2


def _simulate(w, h0, steps, epsilon=None, inputs=None):
    """The panels' recurrences, written again: vanilla (epsilon None) or with feedback."""
    h = np.array(h0, dtype="float64")
    norms = [np.linalg.norm(h)]
    for t in range(steps):
        drive = np.asarray(w) @ h + (0 if inputs is None else inputs[t])
        h = np.tanh(drive) if epsilon is None else h + epsilon * np.tanh(drive)
        norms.append(np.linalg.norm(h))
    return h, np.array(norms)


def _check_panel(panel, initial, steps, epsilon=None, inputs=None):
    for i, h0 in enumerate(initial):
        final, norms = _simulate(panel["matrix"], h0, steps, epsilon,
                                 None if inputs is None else inputs[i])  # fmt: skip
        np.testing.assert_allclose(panel["final_state"][i], final, atol=1e-12)
        np.testing.assert_allclose(panel["final_norm"][i], norms[-1], atol=1e-12)
        np.testing.assert_allclose(panel["max_norm"][i], norms.max(), atol=1e-12)
        np.testing.assert_allclose(panel["min_norm"][i], norms.min(), atol=1e-12)
        np.testing.assert_allclose(panel["norm_ratio"][i], norms[-1] / norms[0], rtol=1e-12)
    eig = np.linalg.eigvals(np.asarray(panel["matrix"]))
    expected = sorted(zip(eig.real, eig.imag, strict=True))
    np.testing.assert_allclose(sorted(map(tuple, panel["eigenvalues"])), expected, atol=1e-12)


def test_every_panel_is_its_documented_recurrence(outputs):
    """Each panel's numbers follow from its matrix, the paper's initial states, ε and T."""
    dynamics = outputs[1]["dynamics"]
    initial, steps, epsilon = dynamics["initial_states"], dynamics["steps"], dynamics["epsilon"]
    assert initial == [[0.0, 0.5], [-0.5, -0.5], [0.5, -0.75]] and epsilon == 0.1
    assert steps == 50
    for panel in dynamics["vanilla"].values():
        _check_panel(panel, initial, steps)
    for panel in dynamics["feedback"].values():
        _check_panel(panel, initial, steps, epsilon)
    # Seed grids (Appendix C): Gaussian W for the vanilla RNN; W - Wᵀ - γI, γ = 0.1, with
    # feedback, for seeds 1..N.
    for seed, panel in dynamics["vanilla_seeds"].items():
        a = np.random.RandomState(int(seed)).standard_normal((2, 2))
        np.testing.assert_allclose(panel["matrix"], a, atol=0)
        _check_panel(panel, initial, steps)
    for seed, panel in dynamics["feedback_seeds"].items():
        a = np.random.RandomState(int(seed)).standard_normal((2, 2))
        np.testing.assert_allclose(panel["matrix"], a - a.T - 0.1 * np.eye(2), atol=1e-15)
        _check_panel(panel, initial, steps, epsilon)
    assert sorted(map(int, dynamics["feedback_seeds"])) == [1, 2, 3, 4]
    # With input: independent N(0, 1) inputs per trajectory (V = I), from `input_seed`.
    with_input = dynamics["feedback_with_input"]
    inputs = np.random.RandomState(with_input["input_seed"]).standard_normal((3, steps, 2))
    for name in ("W+", "W-", "W0", "Wdiff"):
        _check_panel(with_input[name], initial, steps, epsilon, inputs)
        without = np.array(dynamics["feedback"][name]["final_state"])
        assert np.abs(np.array(with_input[name]["final_state"]) - without).max() > 1e-3, name


def test_jacobian_stats_are_the_eigenvalue_and_singular_value_magnitudes():
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(3, 4, 4))
    stats = figures._stats(jac)
    magnitudes = np.abs(np.linalg.eigvals(jac))
    singular = np.linalg.svd(jac, compute_uv=False)
    assert sorted(stats) == ["mean", "std", "sv_max", "sv_min"]
    np.testing.assert_allclose(stats["mean"], magnitudes.mean(), rtol=1e-10)
    np.testing.assert_allclose(stats["std"], magnitudes.std(), rtol=1e-10)
    np.testing.assert_allclose(stats["sv_max"], singular.max(), rtol=1e-10)
    np.testing.assert_allclose(stats["sv_min"], singular.min(), rtol=1e-10)


def test_figure1a_random_weights_send_the_three_states_to_two_fixed_points_on_the_boundary(
    outputs,
):
    """Paper, Figure 1(a): "The three initial points converge to two fixed points on the
    boundary" (standard Gaussian W, the vanilla RNN)."""
    panel = outputs[1]["dynamics"]["vanilla"]["random"]
    w = np.array(panel["matrix"])
    finals = np.array(panel["final_state"])
    np.testing.assert_allclose(np.tanh(finals @ w.T), finals, atol=1e-9)  # fixed points
    distinct = {tuple(np.round(h, 6)) for h in finals}
    assert len(distinct) == 2, finals
    assert np.all(np.abs(finals).max(axis=1) > 0.9), finals  # on the boundary of (-1, 1)²


def test_figure1_panels_carry_the_paper_titles(monkeypatch, tmp_path):
    kept = record_figures(monkeypatch, figures)
    figures.dynamics_figures(str(tmp_path), grid_seeds=1)
    first, *_, with_input = kept
    vanilla, feedback = first.axes[:4], first.axes[4:]
    assert [ax.get_title() for ax in vanilla] == [
        f"vanilla, {name} W" for name in ("random", "identity", "reflection", "rotation")
    ]
    assert [ax.get_title() for ax in feedback] == list(figures.FEEDBACK_TITLES.values())
    assert [ax.get_title() for ax in with_input.axes] == [
        f"{title}, + input" for title in figures.FEEDBACK_TITLES.values()
    ]


def test_the_jacobian_figure_plots_means_and_deviations_against_the_lengths(monkeypatch, tmp_path):
    kept = record_figures(monkeypatch, figures)
    study = {
        "lengths": [10, 20, 40],
        "units": 4, "epsilon": 0.5, "lstm_units": 3, "samples": 2,
        "models": {
            "LSTM": {"10": {"mean": 0.5, "std": 0.1}, "20": {"mean": 0.2, "std": 0.05},
                     "40": {"mean": 0.1, "std": 0.01}},
            "AntisymmetricRNN gamma=0.01": {"10": {"mean": 1.0, "std": 0.02},
                                            "20": {"mean": 0.99, "std": 0.03},
                                            "40": {"mean": 0.98, "std": 0.04}},
        },
    }  # fmt: skip
    figures.plot_jacobian_study(study, str(tmp_path / "jacobian.png"))
    (fig,) = kept
    means, stds = fig.axes[:2]
    for ax, key in ((means, "mean"), (stds, "std")):
        lines = {line.get_label(): line for line in ax.get_lines() if line.get_marker() == "o"}
        assert sorted(lines) == ["LSTM", "γ=0.01"]
        for name, label in (("LSTM", "LSTM"), ("AntisymmetricRNN gamma=0.01", "γ=0.01")):
            np.testing.assert_array_equal(lines[label].get_xdata(), [10, 20, 40])
            expected = [study["models"][name][str(t)][key] for t in (10, 20, 40)]
            np.testing.assert_array_equal(lines[label].get_ydata(), expected)
    assert means.get_title() == "mean of |eigenvalues| of ∂h_T/∂h_0"
    assert stds.get_title() == "standard deviation of |eigenvalues| of ∂h_T/∂h_0"
    assert (tmp_path / "jacobian.png").read_bytes()[:4] == b"\x89PNG"


def test_a_checkpoint_is_measured_on_its_noise_padded_inputs(tmp_path):
    """The entry is the layer's end-to-end Jacobian on `noise_padded_inputs` with the
    study's `--image-rows` and `--seed`, recomputed here from the library."""
    from keras_antisym import diagnostics

    keras.utils.set_random_seed(1)
    layer = AntisymmetricRNN(4, epsilon=0.5, gamma=0.01)
    model = keras.Sequential([keras.Input((6, 3)), layer, keras.layers.Dense(2)])
    path = str(tmp_path / "model.keras")
    model.save(path)
    args = figures.parse_args(["--samples", "2", "--image-rows", "2", "--seed", "5"])
    (entry,) = figures.checkpoint_study([path], args).values()
    assert (entry["layer"], entry["type"]) == (layer.name, "AntisymmetricRNN")
    x = figures.noise_padded_inputs(2, 6, 3, image_rows=2, seed=5)
    expected = figures._stats(diagnostics.end_to_end_jacobian(layer, x))
    assert sorted(entry) == ["6", "layer", "type"]
    for key, value in expected.items():
        assert entry["6"][key] == pytest.approx(value, rel=1e-5), key


def test_noise_padded_inputs_are_standardized_image_rows_then_standard_normal_noise():
    """Uniform rows scaled to zero mean and unit variance (`(u - 1/2)·√12`, so within
    ±√3), then N(0, 1) noise: the paper's noise-padded inputs, 96 features wide."""
    x = figures.noise_padded_inputs(200, 40, seed=1)
    assert x.shape == (200, 40, 96) and x.dtype == np.float32
    image, noise = x[:, :32].astype(np.float64), x[:, 32:].astype(np.float64)
    assert np.abs(image).max() <= np.sqrt(3.0) + 1e-6
    assert abs(image.mean()) < 0.01 and abs(image.var() - 1.0) < 0.02
    assert abs(noise.mean()) < 0.02 and abs(noise.var() - 1.0) < 0.03
    assert np.abs(noise).max() > np.sqrt(3.0)  # Gaussian tails, not uniform
    np.testing.assert_array_equal(figures.noise_padded_inputs(200, 40, seed=1), x)
    assert figures.noise_padded_inputs(3, 10, image_rows=32).shape == (3, 10, 96)
