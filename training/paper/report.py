"""The reproduction report: tables, one JSON of every run, learning curves and the heatmap.

Reads the runs folder of `training.reproduce` (each run's `config.yaml`,
`curve.json` and `metrics.json`; finished or not) and writes
`REPORT_DIR/reproduction.md` and `REPORT_DIR/reproduction/` (`results.json`,
`curves_*.png`, `heatmap_*.png`).
"""

from __future__ import annotations

import csv
import json
import os
import shlex

import numpy as np

from apputil.files import write_atomically
from training.paper.plots import (
    MODEL_LABELS,
    hardware,
    plot_curves,
    plot_heatmap,
    plot_length,
)
from training.paper.suite import data_available, differences_text, train_argv
from training.run.rundir import RunDir

# The report states the spread of this many last evaluations beside each final number:
# how far the curve still oscillates where the run stopped.
LAST_EVALUATIONS = 5


def _read(path, loader):
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return loader(handle)


def portable_dir(path: str) -> str:
    """`path` relative to the working directory when it lies below it, else `RUNS_DIR`.

    A report is read on other machines: it names no folder of the one that wrote it.
    """
    relative = os.path.relpath(os.path.abspath(path))
    return "RUNS_DIR" if relative.startswith(os.pardir) else relative


def collect(run, runs_dir, data_dir):
    """What the runs folder knows of `run`: status, accuracy, steps, time, hardware, command."""
    run_dir = RunDir(os.path.join(runs_dir, run.name))
    config = run_dir.read_config()
    metrics = run_dir.read_metrics()
    curve = run_dir.read_curve()
    points = curve["points"]
    key = f"{curve.get('split', 'test')}_accuracy"
    steps = config.get("steps", run.steps)
    options = run.options()
    row = {
        "name": run.name,
        "table": run.table,
        "row": run.row,
        "seed": config.get("seed", options.get("seed", 0)),
        "task": options["task"],
        "timesteps": options.get("timesteps"),
        "model": options["model"],
        "data": run.data,
        "paper": run.paper,
        "steps_planned": steps,
        "device": config.get("device"),
        "backend": config.get("backend"),
        "command": "python -m training.train "
        + shlex.join(train_argv(run, steps, portable_dir(runs_dir), "DATA_DIR", portable=True)),
        "curve": [
            {"step": p["step"], "seconds": p["train_seconds"], "accuracy": p[key]} for p in points
        ],
    }
    row["curve_split"] = curve.get("split", "test")
    row.update(examples(config))
    permutation = (config.get("task_params") or {}).get("permutation_seed")
    if permutation is not None:
        row["permutation_seed"] = permutation
    if metrics is not None:
        row.update(
            status="finished",
            test_accuracy=metrics["test_accuracy"],
            steps=metrics["steps"],
            train_seconds=metrics.get("train_seconds") or metrics.get("wall_time_seconds"),
            parameters=metrics.get("parameters"),
        )
        if metrics.get("selected_on") == "validation":  # --keep-best: not the last step's
            row["selected_step"] = metrics["selected_step"]
    elif points:
        row.update(
            status="partial",
            test_accuracy=points[-1][key] if key == "test_accuracy" else None,
            steps=points[-1]["step"],
            train_seconds=points[-1]["train_seconds"],
        )
    else:
        available = run.data == "digits" or data_available(run, data_dir)
        row.update(status="not run" if available else "not run (no data)")
    differences = run.other_settings(config)
    if differences and row["status"] in ("finished", "partial"):
        # Recorded before the suite chose otherwise: shown, but no seed of its row and no
        # target's evidence, and its command is not the one that made it.
        row["status"] = f"{row['status']} with other settings: {differences_text(differences)}"
        row["other_settings"] = {k: list(v) for k, v in differences.items()}
    return row


def examples(config):
    """The sizes of the splits a run's `config.yaml` records (those it records)."""
    found = {key: config[key] for key in ("train_examples", "test_examples") if key in config}
    if "validation_examples" in config:
        found["validation_examples"] = config["validation_examples"]
    elif "train_examples" in config:  # recorded before the validation split's size was
        fraction = config.get("validation_fraction") or 0.0
        found["validation_examples"] = round(config["train_examples"] * fraction / (1 - fraction))
    return found


def seed_rows(rows):
    """The rows made of several seeds (runs with a `row`): per row, in the order of `rows`,
    the test accuracies of its finished seeds, their mean and sample standard deviation
    (None below two seeds), the seeds, steps and mean training seconds."""
    grouped: dict[str, list] = {}
    for r in rows:
        if r.get("row"):
            grouped.setdefault(r["row"], []).append(r)
    summary = []
    for name, members in grouped.items():
        done = [r for r in members if r["status"] == "finished"]
        accuracies = [r["test_accuracy"] for r in done]
        seconds = [r["train_seconds"] for r in done if r.get("train_seconds")]
        summary.append({
            "row": name, "table": members[0]["table"], "model": members[0]["model"],
            "paper": members[0]["paper"],
            "seeds": sorted(r["seed"] for r in done),
            "planned_seeds": sorted({r["seed"] for r in members}),
            "test_accuracies": accuracies,
            "mean": float(np.mean(accuracies)) if accuracies else None,
            "sd": float(np.std(accuracies, ddof=1)) if len(accuracies) > 1 else None,
            "steps": sorted({r["steps"] for r in done}),
            "train_seconds_mean": float(np.mean(seconds)) if seconds else None,
            "hardware": sorted({hardware(r["device"]) or "—" for r in done}),
        })  # fmt: skip
    return summary


def _mean_sd_text(entry):
    if entry["mean"] is None:
        return "—"
    sd = "" if entry["sd"] is None else f" ± {100 * entry['sd']:.2f}"
    return f"{100 * entry['mean']:.2f}{sd}%"


def seed_rows_markdown(entries):
    """The seeds' rows as a table: the paper's number, mean ± sd here, seeds, steps, time."""
    lines = [
        "| model (row) | paper | mean ± sd (test) | seeds | each seed | steps | train s (mean) "
        "| hardware |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        each = ", ".join(f"{100 * a:.2f}" for a in e["test_accuracies"]) or "—"
        paper = "—" if e["paper"] is None else f"{e['paper']}%"
        seconds = e["train_seconds_mean"]
        machines = ", ".join(e["hardware"]) or "—"
        lines.append(
            f"| {MODEL_LABELS.get(e['model'], e['model'])} (`{e['row']}`) | {paper} "
            f"| {_mean_sd_text(e)} | {len(e['seeds'])} of {len(e['planned_seeds'])} | {each} "
            f"| {', '.join(map(str, e['steps'])) or '—'} "
            f"| {'—' if seconds is None else f'{seconds:.0f}'} | {machines} |"
        )
    return "\n".join(lines)


def seed_targets_markdown(entries, targets):
    """Each target row: its mean over seeds against the paper's number; met only with
    every planned seed finished (a row's number is the mean, not the best seed)."""
    lines = [
        "| row | paper | mean ± sd (test) | seeds | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    by_name = {e["row"]: e for e in entries}
    for name in targets:
        e = by_name.get(name)
        if e is None:
            continue
        if e["mean"] is None:
            verdict = "not run"
        elif len(e["seeds"]) < len(e["planned_seeds"]):
            verdict = "seeds still to run"
        elif 100 * e["mean"] >= e["paper"]:
            verdict = "met"
        else:
            verdict = f"missed by {e['paper'] - 100 * e['mean']:.2f} points"
        lines.append(
            f"| `{name}` | {e['paper']}% | {_mean_sd_text(e)} "
            f"| {len(e['seeds'])} of {len(e['planned_seeds'])} | {verdict} |"
        )
    return "\n".join(lines)


def last_spread(curve, count=LAST_EVALUATIONS):
    """Min and max accuracy of the last `count` points of a row's curve, and how many there
    were (fewer in a short curve); None without a curve."""
    last = [point["accuracy"] for point in curve[-count:]]
    if not last:
        return None
    return {"min": min(last), "max": max(last), "evaluations": len(last)}


def _spread_text(row):
    spread = last_spread(row["curve"])
    if spread is None:
        return "—"
    text = f"{100 * spread['min']:.1f}–{100 * spread['max']:.1f}%"
    if spread["evaluations"] < LAST_EVALUATIONS:
        text += f" (last {spread['evaluations']})"
    split = row.get("curve_split")
    return f"{text}, {split}" if split else text


def _steps_text(row):
    steps = row.get("steps", "—")
    selected = row.get("selected_step")
    return f"{steps} (best: {selected})" if selected is not None else f"{steps}"


def _last_accuracy(row, key, limit):
    """The curve's last accuracy whose `key` ("step" or "seconds") is at most `limit`."""
    points = [p for p in row["curve"] if p[key] <= limit]
    return points[-1]["accuracy"] if points else None


def accuracy_at(row, seconds):
    """The curve's last accuracy at or before `seconds` of training (None if none)."""
    return _last_accuracy(row, "seconds", seconds + 1e-9)


def _percent(value):
    return "—" if value is None else f"{100 * value:.1f}%"


def equal_times(rows):
    """Per row (a list in the order of `rows`), the training seconds of the fastest run of
    its table on the same hardware (None when it has no such partner): only those times
    compare."""
    times = []
    for r in rows:
        peers = [
            p["train_seconds"]
            for p in rows
            if hardware(p["device"]) == hardware(r["device"])
            and p.get("train_seconds")
            and p["curve"]
        ]
        times.append(min(peers) if len(peers) > 1 and r["curve"] else None)
    return times


def accuracy_at_step(row, step):
    """The row's accuracy after `step` steps: its final test accuracy when it stopped
    there, else its curve's last point at or before `step` (None if none)."""
    if row.get("steps") == step and row.get("test_accuracy") is not None:
        return row["test_accuracy"]
    return _last_accuracy(row, "step", step)


def table_markdown(rows):
    """One markdown table: paper, ours at equal steps and at equal wall time, the spread of
    the last evaluations."""
    times = equal_times(rows)
    lines = [
        "| model | paper | ours (test) | at equal time, same hardware "
        f"| last {LAST_EVALUATIONS} evaluations | steps | train s | status | hardware |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r, equal in zip(rows, times, strict=True):
        at_equal = "—" if equal is None else f"{_percent(accuracy_at(r, equal))} ({equal:.0f} s)"
        seconds = r.get("train_seconds")
        paper = "—" if r["paper"] is None else f"{r['paper']}%"
        lines.append(
            f"| {MODEL_LABELS.get(r['model'], r['model'])} (`{r['name']}`) | {paper} "
            f"| {_percent(r.get('test_accuracy'))} | {at_equal} | {_spread_text(r)} "
            f"| {_steps_text(r)} | {'—' if seconds is None else f'{seconds:.0f}'} "
            f"| {r['status']} | {r['device'] or '—'} |"
        )
    return "\n".join(lines)


# The columns of a `trials.csv` the report reads, each with its type.
_SEARCH_COLUMNS = {
    "epsilon": float, "gamma": float, "learning_rate": float, "optimizer": str, "score": float,
}  # fmt: skip
# How a search's table names each hyperparameter it shows.
_SEARCH_HEADINGS = {"learning_rate": "learning rate", "optimizer": "optimizer"}


def read_search(path):
    """Completed trials of a `training.tune` `trials.csv`: its hyperparameters (floats,
    the optimizer's name) and score."""
    rows = _read(path, lambda handle: list(csv.DictReader(handle))) or []
    return [
        {k: _SEARCH_COLUMNS[k](v) for k, v in row.items() if k in _SEARCH_COLUMNS and v}
        for row in rows
        if row.get("status") == "COMPLETED" and row.get("score")
    ]


def targets_markdown(rows, targets):
    """Each target: the best counted model's accuracy, its margin, and its lead on the best
    rival run at equal steps and, on the same hardware, at equal time."""
    lines = [
        "| target | measured | margin | lead over the best LSTM (equal steps / time) |",
        "| --- | --- | --- | --- |",
    ]
    for what, table, models, threshold, rival, minimum_lead in targets:
        members = [r for r in rows if r["table"] == table]
        current = [r for r in members if r.get("test_accuracy") and not r.get("other_settings")]
        counted = [r for r in current if r["model"] in models]
        rivals = [r for r in current if r["model"] == rival]
        if not counted:
            lines.append(f"| {what} ≥ {threshold:.0%} | not run | — | — |")
            continue
        best = max(counted, key=lambda r: r["test_accuracy"])
        margin = best["test_accuracy"] - threshold
        verdict = "met" if margin >= 0 else f"missed by {-margin * 100:.1f} points"
        lead_text = "—"
        if rivals:  # each rival run is the rival at one of its own settings
            steps_lead = _lead_at_equal_steps(best, rivals)
            time_lead = "— (other hardware)"
            peers = [r for r in rivals if hardware(r["device"]) == hardware(best["device"])]
            if peers:
                equal = min(best.get("train_seconds") or 0,
                            max(r.get("train_seconds") or 0 for r in peers))  # fmt: skip
                rival = max(accuracy_at(r, equal) or 0 for r in peers)
                time_lead = f"{((accuracy_at(best, equal) or 0) - rival) * 100:+.1f}"
            lead_text = f"{steps_lead} / {time_lead} points"
            if minimum_lead:
                lead_text += f" (target ≥ +{minimum_lead * 100:.0f})"
        lines.append(
            f"| {what} ≥ {threshold:.0%} | {best['test_accuracy']:.1%} (`{best['name']}`, "
            f"{best['status']} at step {best['steps']}) | {verdict} | {lead_text} |"
        )
    return "\n".join(lines)


def _lead_at_equal_steps(best, rivals):
    """`best`'s lead on the best of `rivals` after equal steps: its own steps, or, when no
    rival ran them, the most a rival ran (then named)."""
    step = min(best["steps"], max(r["steps"] for r in rivals))
    rival = max(accuracy_at_step(r, step) or 0 for r in rivals if r["steps"] >= step)
    text = f"{((accuracy_at_step(best, step) or 0) - rival) * 100:+.1f}"
    return text if step == best["steps"] else f"{text} (step {step})"


def _previous(assets):
    """Rows of an earlier `results.json` that have a curve (runs made on other machines)."""
    old = _read(os.path.join(assets, "results.json"), json.load) or {}
    return [row for row in old.get("runs", []) if row.get("curve")]


# What the suite says of a run rather than what the run measured: a row kept from an
# earlier report takes them from the suite as it is now.
SUITE_FIELDS = ("table", "row", "paper")


def merge(fresh, previous):
    """The report's rows: per run of `fresh` (rows of this runs folder, in suite order),
    its fresh row when it has a curve, and the previous rows of the same run on other
    hardware; a run with no fresh curve keeps all its previous rows. A kept row's table,
    seed row and paper number are the suite's (`SUITE_FIELDS` of the fresh row)."""
    rows = []
    for row in fresh:
        suite = {key: row[key] for key in SUITE_FIELDS if key in row}
        kept = [{**p, **suite} for p in previous if p["name"] == row["name"]]
        if row["curve"]:
            kept = [p for p in kept if hardware(p["device"]) != hardware(row["device"])]
        rows += ([row] if row["curve"] or not kept else []) + kept
    return rows


_PREAMBLE = (
    "Written by `python -m training.reproduce` from its runs folder: every number below "
    "is a run of `python -m training.train` (the command is in `results.json`). "
    "*ours (test)*: test accuracy after the run's steps (for a partial run, the last "
    "evaluation of its learning curve); *at equal time*: each model's accuracy at the "
    "training seconds of its table's fastest run on the same hardware (the same machine, "
    "each model on the backend it ran on; a run made on several machines has a row for "
    "each); *last 5 "
    "evaluations*: the lowest and highest accuracy of the last five points of the run's "
    "learning curve (on its validation split, or the test split without one), how far "
    "it still moved where it stopped; *steps*: with `(best: S)` the run tested the "
    "weights of its best validation evaluation, at step S (`--keep-best`). Seconds are each "
    "run's own training wall time (evaluations excluded) on the hardware shown; runs "
    "that shared a machine with other runs (`--parallel`) ran slower, so compare "
    "seconds only between runs made together."
)


_SEEDS_PREAMBLE = (
    "Each row is the mean ± sample standard deviation of the test accuracy of its seeds "
    "(each seed its own initialization and data order), every seed's weights chosen on the "
    "validation split cut from the training digits (`--keep-best`) and tested once; a row "
    "counts as met when every planned seed has finished and the mean reaches the paper's "
    "number."
)


def write(
    runs: list,
    runs_dir: str,
    report_dir: str,
    searches: dict | None = None,
    data_dir: str | None = None,
    targets: tuple = (),
    seed_targets: tuple = (),
) -> str:
    """Writes the report of `runs` (a suite); returns the markdown file's path.

    A run the runs folder knows nothing of keeps its rows from the report's
    previous `results.json` (a run made on another machine stays reported), and
    a run made on several machines has a row per machine (`merge`); so does a
    search: `searches` maps each `training.paper.suite.Search` to its
    `trials.csv`.
    """
    assets = os.path.join(report_dir, "reproduction")
    os.makedirs(assets, exist_ok=True)
    previous = _previous(assets)
    rows = merge([collect(run, runs_dir, data_dir) for run in runs], previous)
    for row in rows:  # rows kept from an earlier report too: their curve is in it
        row["last_spread"] = last_spread(row["curve"])
    seeds = seed_rows(rows)
    lines = ["# Reproduction", "", _PREAMBLE, ""]
    if seed_targets and seeds:
        lines += ["## The paper's Table 1 (mean of the seeds)", "", _SEEDS_PREAMBLE, "",
                  seed_targets_markdown(seeds, seed_targets), ""]  # fmt: skip
    if targets:
        lines += ["## Targets", "", targets_markdown(rows, targets), ""]
    for table in dict.fromkeys(r["table"] for r in rows):
        members = [e for e in seeds if e["table"] == table]
        lines += _table_section(table, [r for r in rows if r["table"] == table], assets, members)
    lines += _length_section(rows, assets)
    earlier = _previous_searches(assets)
    found = {}
    for each, path in (searches or {}).items():
        found[each.name] = read_search(path) or earlier.get(each.name, [])
        lines += _search_section(each, found[each.name], assets)
    text = json.dumps({"rows": seeds, "runs": rows, "search": found}, indent=1)
    write_atomically(os.path.join(assets, "results.json"), text)
    path = os.path.join(report_dir, "reproduction.md")
    write_atomically(path, "\n".join(lines) + "\n")
    return path


def _table_section(table, members, assets, seeds=()):
    slug = "".join(c if c.isalnum() else "_" for c in table).strip("_")
    lines = [f"## {table}", ""]
    if seeds:
        lines += ["Each row over its seeds:", "", seed_rows_markdown(seeds), "",
                  "Each run:", ""]  # fmt: skip
    lines += [table_markdown(members), ""]
    if plot_curves(table, members, os.path.join(assets, f"curves_{slug}.png")):
        lines += [f"![{table}](reproduction/curves_{slug}.png)", ""]
    missing = [r for r in members if r["status"] == "not run (no data)"]
    if missing:
        lines += ["Not run (no data in the data directory); with the data:", "", "```sh"]
        lines += [r["command"] for r in missing] + ["```", ""]
    return lines


def _length_section(rows, assets):
    if not plot_length(rows, "noise_padded_mnist", os.path.join(assets, "length.png")):
        return []
    return [
        "## Accuracy against the sequence length",
        "",
        "Noise-padded Fashion-MNIST, each model's main config at T = 100, 300, 1000 "
        "(the T=1000 points are the table above; partial runs count with their "
        "last evaluation):",
        "",
        "![length](reproduction/length.png)",
        "",
    ]


def _previous_searches(assets):
    """Trials of an earlier `results.json`, by search name."""
    found = (_read(os.path.join(assets, "results.json"), json.load) or {}).get("search", {})
    if isinstance(found, list):  # a report that had the gated model's search alone
        found = {"search_noise_padded_gated": found}
    return found


def _search_section(search, trials, assets):
    if not trials:
        return []
    label = MODEL_LABELS[search.model]
    title = f"{search.title}, {label}"
    steps = search.argv[search.argv.index("--steps-per-trial") + 1]
    lines = [f"## Search: {label} ({search.title})", ""]
    count = f"{len(trials)} trial" + ("" if len(trials) == 1 else "s")
    lines += [f"{title}: validation accuracy after {steps} steps ({count}, "
              f"`python -m training.reproduce --search --only {search.name}`).", ""]  # fmt: skip
    if search.grid == ("epsilon", "gamma"):
        figure = f"heatmap_{search.name}.png"
        plot_heatmap(trials, title, os.path.join(assets, figure))
        return lines + [f"![{search.name}](reproduction/{figure})", ""]
    columns = search.grid
    headings = [_SEARCH_HEADINGS[c] for c in columns] + ["validation accuracy"]
    lines.append("| " + " | ".join(headings) + " |")
    lines.append("| --- " * (len(columns) + 1) + "|")
    for trial in sorted(trials, key=lambda t: tuple(t[c] for c in columns)):
        cells = [f"{trial[c]:g}" if isinstance(trial[c], float) else trial[c] for c in columns]
        lines.append("| " + " | ".join(cells) + f" | {_percent(trial['score'])} |")
    return lines + [""]
