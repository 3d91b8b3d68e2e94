"""The CPU suite's layer lists and what `benchmarks.run` writes of its measurements: the
ratios against the anchors measured in the same run, and the Markdown tables.

Imports the standard library only (see `benchmarks.common`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from benchmarks.common import table

LAYERS = (
    "AntisymmetricRNN",
    "GatedAntisymmetricRNN",
    "RNN(AntisymmetricCell)",
    "SimpleRNN",
    "GRU",
    "LSTM",
)

FUSED_LAYERS = ("AntisymmetricRNN", "GatedAntisymmetricRNN")
PRECISION_LAYERS = ("AntisymmetricRNN", "GatedAntisymmetricRNN", "RNN(AntisymmetricCell)")
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def precision_ratios(precision):
    t = {k: v["median"] for k, v in precision["times"].items()}
    names = sorted({key.split("|")[0] for key in t}, key=PRECISION_LAYERS.index)
    return {
        f"{name} {policy}/float32": t[f"{name}|{policy}"] / t[f"{name}|float32"]
        for name in names
        for policy in POLICIES[1:]
    }


def precision_markdown(precision):
    shape = (
        f"B{precision['batch']} T{precision['steps']} m{precision['features']} "
        f"n{precision['units']}"
    )
    t = precision["times"]
    names = sorted({key.split("|")[0] for key in t}, key=PRECISION_LAYERS.index)
    rows = [[name] + [f"{t[f'{name}|{p}']['median']:.4f}" for p in POLICIES] for name in names]
    return ["", *table([f"training step by dtype policy, {shape} (s)", *POLICIES], rows)]


def training_ratios(entry):
    """One training entry's ratios to Keras' layers and to the floor (medians)."""
    t = {k: v["median"] for k, v in entry["times"].items()}
    return {
        "AntisymmetricRNN/SimpleRNN": t["AntisymmetricRNN"] / t["SimpleRNN"],
        "GatedAntisymmetricRNN/SimpleRNN": t["GatedAntisymmetricRNN"] / t["SimpleRNN"],
        "RNN(AntisymmetricCell)/SimpleRNN": t["RNN(AntisymmetricCell)"] / t["SimpleRNN"],
        "AntisymmetricRNN/LSTM": t["AntisymmetricRNN"] / t["LSTM"],
        "AntisymmetricRNN/floor": t["AntisymmetricRNN"] / entry["floor"]["median"],
    }


def hoist_ratios(hoist):
    t = {k: v["median"] for k, v in hoist["times"].items()}
    shape = f"m={hoist['features']}, T={hoist['steps']}"
    return {
        f"{name} hoisted/not hoisted ({shape})": t[f"{name}|hoist=True"] / t[f"{name}|hoist=False"]
        for name in ("AntisymmetricRNN", "GatedAntisymmetricRNN")
    }


def ratios(results):
    """The suite's targets, as ratios measured in the same run."""
    out = {}
    for entry in results["training"]:
        key = f"train_B{entry['batch']}_T{entry['steps']}_m{entry['features']}_n{entry['units']}"
        out[key] = training_ratios(entry)
    by_steps = {e["steps"]: e for e in results["training"] if e["features"] == 1}
    if len(by_steps) >= 2:
        short, long = sorted(by_steps)[-2:]
        for name in ("AntisymmetricRNN", "GatedAntisymmetricRNN"):
            out[f"{name} T={long}/T={short}"] = (
                by_steps[long]["times"][name]["median"] / by_steps[short]["times"][name]["median"]
            )
    jit = results.get("jit")
    if jit:
        t = {k: v["median"] for k, v in jit["times"].items()}
        for name in LAYERS:
            out[f"{name} jit=True/jit=False"] = t[f"{name}|jit=True"] / t[f"{name}|jit=False"]
    hoist = results.get("hoist")
    if hoist:
        out.update(hoist_ratios(hoist))
    for entry in results.get("inference", []):
        t = {k: v["median"] for k, v in entry["times"].items()}
        for name in FUSED_LAYERS:
            if f"{name}|keras_loop" in t:
                key = f"{name} inference B{entry['batch']} T{entry['steps']}: own loop/Keras' loop"
                out[key] = t[name] / t[f"{name}|keras_loop"]
    precision = results.get("precision")
    if precision:
        out.update(precision_ratios(precision))
    e2e = results.get("end_to_end")
    if e2e:
        out["training.train examples/s / bare step examples/s"] = e2e["train_over_bare"]
    memory = results.get("memory")
    if memory:
        lstm = memory["layers"]["LSTM"]["peak_growth_mib"]
        ours = ("AntisymmetricRNN", "GatedAntisymmetricRNN", "RNN(AntisymmetricCell)")
        for name in ours if lstm > 0 else ():  # tiny (--quick) shapes may not grow the peak
            out[f"{name} peak memory/LSTM"] = memory["layers"][name]["peak_growth_mib"] / lstm
    return out


def hoist_markdown(hoist):
    shape = f"B{hoist['batch']} T{hoist['steps']} m{hoist['features']} n{hoist['units']}"
    rows = [(name.replace("|", ", "), f"{t['median']:.4f}") for name, t in hoist["times"].items()]
    return ["", *table([f"input projection, training step {shape} (s)", "median"], rows)]


def training_markdown(entries, layers=LAYERS):
    """The training-step table: per shape, each layer's median (min-max) and the floor."""

    def cell(timing):
        return f"{timing['median']:.4f} ({timing['min']:.4f}-{timing['max']:.4f})"

    rows = [
        [f"B{e['batch']} T{e['steps']} m{e['features']} n{e['units']}"]
        + [cell(e["times"][n]) for n in layers]
        + [f"{e['floor']['median']:.4f}"]
        for e in entries
    ]
    return table(["training step (s)", *layers, "floor"], rows)


def ratios_markdown(values):
    """The ratio table; a dict value is one row per key."""
    rows = []
    for name, value in values.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        rows += [(name if key is None else f"{name}: {key}", f"{v:.3f}") for key, v in items]
    return table(["ratio (same run, medians)", "value"], rows)


def markdown(results):
    rows: list[Sequence[object]]
    lines = [f"Environment: {json.dumps(results['environment'])}", ""]
    lines += training_markdown(results["training"])
    if results.get("hoist"):
        lines += hoist_markdown(results["hoist"])
    if results.get("precision"):
        lines += precision_markdown(results["precision"])
    for entry in results.get("inference", []):
        t = entry["times"]
        anchor = {n: t.get(f"{n}|keras_loop", {}).get("median") for n in LAYERS}
        # Results measured before the fused layers had a loop of their own have no anchor
        # column: their table stays as it was written.
        anchored = any(value is not None for value in anchor.values())
        header = [f"inference B{entry['batch']} T{entry['steps']} (s)", "in process", "SavedModel",
                  *(["Keras' loop"] if anchored else [])]  # fmt: skip
        rows = [
            (n, f"{t[n]['median']:.4f}", f"{t[f'{n}|saved_model']['median']:.4f}",
             *(["" if anchor[n] is None else f"{anchor[n]:.4f}"] if anchored else []))
            for n in LAYERS
        ]  # fmt: skip
        lines += ["", *table(header, rows)]
    if results.get("memory"):
        memory = results["memory"]
        rows = [(n, f"{v['peak_growth_mib']:.1f}") for n, v in memory["layers"].items()]
        header = [f"peak memory, training step {memory['shape']}", "growth (MiB)"]
        lines += ["", *table(header, rows)]
    for backend, other in results.get("backends", {}).items():
        rows = [
            [f"B{e['batch']} T{e['steps']} m{e['features']}"]
            + [f"{e['times'][n]['median']:.4f}" for n in LAYERS]
            for e in other["training"]
        ]
        lines += ["", *table([f"{backend} training step (s)", *LAYERS], rows)]
    lines += ["", *ratios_markdown(results["ratios"])]
    return "\n".join(lines) + "\n"
