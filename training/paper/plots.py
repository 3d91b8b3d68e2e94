"""The reproduction report's figures: learning curves, accuracy against the sequence
length, and a search's ε × γ heatmap (matplotlib's `Figure`, drawn off-screen), with the
names the report gives models and machines."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

MODEL_LABELS = {
    "antisymmetric": "AntisymmetricRNN",
    "gated": "AntisymmetricRNN w/ gating",
    "ablation": "Ablation model",
    "lstm": "LSTM",
}


def hardware(device):
    """The machine of a row's `device` ("jax on 1 x NVIDIA H100 (gpu)" -> "1 x NVIDIA H100
    (gpu)"): runs on one machine compare in time, each on the backend it ran on."""
    if not device:
        return None
    return device.split(" on ", 1)[1] if " on " in device else device


def curve_label(rows):
    """The y label of curves of `rows`: what their points are accuracies on."""
    splits = {r.get("curve_split") or "test" for r in rows}
    if len(splits) == 1:
        return f"{splits.pop()} accuracy"
    return "accuracy (" + " or ".join(sorted(splits)) + ": see the table)"


def plot_curves(title, rows, path):
    """Accuracy against steps and against seconds, every model of a table on one plot."""
    rows = [r for r in rows if r["curve"]]
    if not rows:
        return False
    figure = Figure(figsize=(11, 4))
    axes = figure.subplots(1, 2)
    names = [r["name"] for r in rows]
    for r in rows:
        steps = [p["step"] for p in r["curve"]]
        seconds = [p["seconds"] for p in r["curve"]]
        accuracy = [p["accuracy"] for p in r["curve"]]
        label = r["name"]
        if names.count(label) > 1:  # one run on several machines
            label += f" ({hardware(r['device'])})"
        axes[0].plot(steps, accuracy, marker=".", label=label)
        axes[1].plot(seconds, accuracy, marker=".", label=label)
    axes[0].set_xlabel("training steps")
    axes[1].set_xlabel("training seconds")
    for axis in axes:
        axis.set_ylabel(curve_label(rows))
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return True


def plot_length(rows, task, path):
    """Test accuracy against the sequence length T, one line per model (the main configs)."""
    chosen = [r for r in rows if r.get("task") == task and r.get("test_accuracy") is not None
              and r["name"].startswith(task.replace("mnist", "fashion_mnist"))]  # fmt: skip
    models = sorted({r["model"] for r in chosen})
    best: dict[tuple, dict] = {}  # a run made on several machines: its best row
    for r in chosen:
        key = (r["model"], r["timesteps"])
        best[key] = max(best.get(key, 0), r["test_accuracy"])
    lines = {m: sorted((t, a) for (model, t), a in best.items() if model == m) for m in models}
    lines = {m: points for m, points in lines.items() if len(points) > 1}
    if not lines:
        return None
    figure = Figure(figsize=(5.5, 3.6))
    axis = figure.subplots()
    for model, points in lines.items():
        axis.plot(*zip(*points, strict=True), marker="o", label=MODEL_LABELS.get(model, model))
    axis.set_xscale("log")
    axis.set_xlabel("sequence length T (28 image rows, then noise)")
    axis.set_ylabel("test accuracy")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return lines


def plot_heatmap(trials, title, path):
    """Validation accuracy over ε × γ (the mean over trials of each cell)."""
    epsilons = sorted({t["epsilon"] for t in trials})
    gammas = sorted({t["gamma"] for t in trials})
    grid = np.full((len(epsilons), len(gammas)), np.nan)
    for i, e in enumerate(epsilons):
        for j, g in enumerate(gammas):
            scores = [t["score"] for t in trials if t["epsilon"] == e and t["gamma"] == g]
            if scores:
                grid[i, j] = np.mean(scores)
    figure = Figure(figsize=(5, 3.6))
    axis = figure.subplots()
    image = axis.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="lower")
    axis.set_xticks(range(len(gammas)), [f"{g:g}" for g in gammas])
    axis.set_yticks(range(len(epsilons)), [f"{e:g}" for e in epsilons])
    axis.set_xlabel("γ (diffusion)")
    axis.set_ylabel("ε (step size)")
    for i in range(len(epsilons)):
        for j in range(len(gammas)):
            if not np.isnan(grid[i, j]):
                axis.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", color="w")
    figure.colorbar(image, label="validation accuracy")
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return grid
