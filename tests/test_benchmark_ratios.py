"""The benchmarks' ratios and tables from made-up timings, against hand-computed values."""

import pytest

from benchmarks import accelerator, run, tables
from benchmarks.tables import LAYERS, POLICIES, PRECISION_LAYERS


def _timing(median, low=None, high=None):
    low = median / 2 if low is None else low
    high = median * 2 if high is None else high
    return {"median": median, "min": low, "max": high}


def _training_entry(batch, steps, features, units, scale=1.0):
    """Medians 1, 2, 3, ... (times `scale`) for LAYERS in order; floor 0.5."""
    times = {name: _timing(scale * (index + 1)) for index, name in enumerate(LAYERS)}
    return {
        "batch": batch, "steps": steps, "features": features, "units": units,
        "times": times, "floor": _timing(0.5 * scale),
    }  # fmt: skip


def test_training_ratios_divide_the_medians():
    # AntisymmetricRNN 1, Gated 2, RNN(cell) 3, SimpleRNN 4, GRU 5, LSTM 6, floor 0.5.
    assert tables.training_ratios(_training_entry(8, 20, 1, 8)) == {
        "AntisymmetricRNN/SimpleRNN": 0.25,
        "GatedAntisymmetricRNN/SimpleRNN": 0.5,
        "RNN(AntisymmetricCell)/SimpleRNN": 0.75,
        "AntisymmetricRNN/LSTM": pytest.approx(1 / 6),
        "AntisymmetricRNN/floor": 2.0,
    }


def test_hoist_ratios_name_the_shape():
    hoist = {
        "batch": 8, "steps": 20, "features": 9, "units": 8,
        "times": {
            "AntisymmetricRNN|hoist=True": _timing(1.0),
            "AntisymmetricRNN|hoist=False": _timing(4.0),
            "GatedAntisymmetricRNN|hoist=True": _timing(3.0),
            "GatedAntisymmetricRNN|hoist=False": _timing(2.0),
        },
    }  # fmt: skip
    assert tables.hoist_ratios(hoist) == {
        "AntisymmetricRNN hoisted/not hoisted (m=9, T=20)": 0.25,
        "GatedAntisymmetricRNN hoisted/not hoisted (m=9, T=20)": 1.5,
    }


def _run_results(lstm_peak=4.0):
    training = [
        _training_entry(8, 20, 1, 8),
        _training_entry(8, 40, 1, 8, scale=3.0),
        _training_entry(8, 80, 1, 8, scale=5.0),
        _training_entry(8, 160, 3, 8, scale=100.0),  # m != 1: not in the T ratio
    ]
    jit = {}
    for index, name in enumerate(LAYERS):
        jit[f"{name}|jit=True"] = _timing(index + 1.0)
        jit[f"{name}|jit=False"] = _timing(2 * (index + 1.0))
    precision = {}
    for index, name in enumerate(PRECISION_LAYERS):
        for factor, policy in zip((1.0, 0.5, 0.25), POLICIES, strict=True):
            precision[f"{name}|{policy}"] = _timing(factor * (index + 1))
    peaks = dict(zip(LAYERS, (1.0, 2.0, 3.0, 0.5, 5.0, lstm_peak), strict=True))
    return {
        "training": training,
        "jit": {"times": jit},
        "hoist": {
            "batch": 8, "steps": 20, "features": 9, "units": 8,
            "times": {
                "AntisymmetricRNN|hoist=True": _timing(1.0),
                "AntisymmetricRNN|hoist=False": _timing(2.0),
                "GatedAntisymmetricRNN|hoist=True": _timing(1.0),
                "GatedAntisymmetricRNN|hoist=False": _timing(5.0),
            },
        },
        "precision": {"batch": 8, "steps": 20, "features": 1, "units": 8, "times": precision},
        "end_to_end": {"train_over_bare": 0.8},
        "memory": {
            "shape": [8, 30, 1, 8],
            "layers": {name: {"peak_growth_mib": peak} for name, peak in peaks.items()},
        },
    }  # fmt: skip


def test_run_ratios_cover_every_section():
    out = tables.ratios(_run_results())
    assert out["train_B8_T20_m1_n8"] == tables.training_ratios(_training_entry(8, 20, 1, 8))
    assert out["train_B8_T160_m3_n8"]["AntisymmetricRNN/floor"] == 2.0
    # The two longest single-feature shapes (T=80 over T=40): 5/3, for both models.
    assert out["AntisymmetricRNN T=80/T=40"] == pytest.approx(5 / 3)
    assert out["GatedAntisymmetricRNN T=80/T=40"] == pytest.approx(5 / 3)
    assert "AntisymmetricRNN T=160/T=80" not in out and "AntisymmetricRNN T=40/T=20" not in out
    for name in LAYERS:
        assert out[f"{name} jit=True/jit=False"] == 0.5
    assert out["AntisymmetricRNN hoisted/not hoisted (m=9, T=20)"] == 0.5
    assert out["GatedAntisymmetricRNN hoisted/not hoisted (m=9, T=20)"] == 0.2
    for name in PRECISION_LAYERS:
        assert out[f"{name} mixed_bfloat16/float32"] == 0.5
        assert out[f"{name} mixed_float16/float32"] == 0.25
    assert out["training.train examples/s / bare step examples/s"] == 0.8
    assert out["AntisymmetricRNN peak memory/LSTM"] == 0.25
    assert out["GatedAntisymmetricRNN peak memory/LSTM"] == 0.5
    assert out["RNN(AntisymmetricCell) peak memory/LSTM"] == 0.75
    assert "SimpleRNN peak memory/LSTM" not in out and "GRU peak memory/LSTM" not in out
    expected_keys = 4 + 2 + len(LAYERS) + 2 + 2 * len(PRECISION_LAYERS) + 1 + 3
    assert len(out) == expected_keys


def test_run_ratios_leave_out_missing_sections_and_an_lstm_that_did_not_grow():
    results = _run_results(lstm_peak=0.0)
    del results["jit"], results["hoist"], results["precision"], results["end_to_end"]
    results["training"] = results["training"][:1]  # one shape: no T ratio
    out = tables.ratios(results)
    assert list(out) == ["train_B8_T20_m1_n8"]


def test_run_tables_format_medians_and_ranges():
    entry = _training_entry(8, 20, 1, 8)
    lines = tables.training_markdown([entry])
    assert lines[0] == "| training step (s) | " + " | ".join(LAYERS) + " | floor |"
    assert lines[2] == (
        "| B8 T20 m1 n8 | 1.0000 (0.5000-2.0000) | 2.0000 (1.0000-4.0000) | "
        "3.0000 (1.5000-6.0000) | 4.0000 (2.0000-8.0000) | 5.0000 (2.5000-10.0000) | "
        "6.0000 (3.0000-12.0000) | 0.5000 |"
    )
    assert tables.ratios_markdown({"a": 0.12345, "b": {"x": 2.0, "y": 1 / 3}}) == [
        "| ratio (same run, medians) | value |",
        "|---|---|",
        "| a | 0.123 |",
        "| b: x | 2.000 |",
        "| b: y | 0.333 |",
    ]
    results = _run_results()
    hoist = tables.hoist_markdown(results["hoist"])
    assert hoist[1] == "| input projection, training step B8 T20 m9 n8 (s) | median |"
    assert "| AntisymmetricRNN, hoist=False | 2.0000 |" in hoist
    precision = tables.precision_markdown(results["precision"])
    assert precision[1] == (
        "| training step by dtype policy, B8 T20 m1 n8 (s) | " + " | ".join(POLICIES) + " |"
    )
    assert "| GatedAntisymmetricRNN | 2.0000 | 1.0000 | 0.5000 |" in precision


def test_run_markdown_puts_the_sections_in_order():
    results = _run_results()
    results["environment"] = {"backend": "tensorflow"}
    results["ratios"] = {"r": 1.5}
    times = {}
    for index, name in enumerate(LAYERS):
        times[name] = _timing(0.001 * (index + 1))
        times[f"{name}|saved_model"] = _timing(0.01 * (index + 1))
    results["inference"] = [{"batch": 1, "steps": 20, "times": times}]
    results["backends"] = {"jax": {"training": [_training_entry(8, 20, 1, 8, scale=0.1)]}}
    text = tables.markdown(results)
    assert text.startswith('Environment: {"backend": "tensorflow"}\n\n| training step (s) |')
    assert text.endswith("| r | 1.500 |\n")
    order = [
        "| input projection",
        "| training step by dtype policy",
        "| inference B1 T20 (s) | in process | SavedModel |",
        "| peak memory, training step [8, 30, 1, 8] | growth (MiB) |",
        "| jax training step (s) |",
        "| ratio (same run, medians) |",
    ]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions)
    assert "| GRU | 0.0050 | 0.0500 |" in text
    assert "| GRU | 5.0 |" in text
    assert "| B8 T20 m1 | 0.1000 | 0.2000 |" in text


def test_inference_table_has_the_keras_loop_column_only_where_it_was_measured():
    times = {}
    for index, name in enumerate(LAYERS):
        times[name] = _timing(0.001 * (index + 1))
        times[f"{name}|saved_model"] = _timing(0.01 * (index + 1))
    without = {"environment": {}, "training": [], "ratios": {},
               "inference": [{"batch": 1, "steps": 20, "times": dict(times)}]}  # fmt: skip
    text = tables.markdown(without)
    assert "| inference B1 T20 (s) | in process | SavedModel |\n" in text
    assert "| AntisymmetricRNN | 0.0010 | 0.0100 |\n" in text
    times["AntisymmetricRNN|keras_loop"] = _timing(0.003)
    times["GatedAntisymmetricRNN|keras_loop"] = _timing(0.004)
    anchored = dict(without, inference=[{"batch": 1, "steps": 20, "times": times}])
    text = tables.markdown(anchored)
    assert "| inference B1 T20 (s) | in process | SavedModel | Keras' loop |\n" in text
    assert "| AntisymmetricRNN | 0.0010 | 0.0100 | 0.0030 |\n" in text
    assert "| GatedAntisymmetricRNN | 0.0020 | 0.0200 | 0.0040 |\n" in text
    assert "| GRU | 0.0050 | 0.0500 |  |\n" in text  # no loop of its own to compare


def _kernel_results():
    def entry(shape, fused_ungated, fused_gated):
        return {
            "shape": shape,
            "times": {
                "AntisymmetricRNN|fused_kernel=True": _timing(fused_ungated),
                "AntisymmetricRNN|fused_kernel=False": _timing(4.0),
                "GatedAntisymmetricRNN|fused_kernel=True": _timing(fused_gated),
                "GatedAntisymmetricRNN|fused_kernel=False": _timing(8.0),
            },
        }

    return {
        "training": [entry([8, 20, 1, 8], 1.0, 3.0), entry([8, 80, 1, 8], 2.5, 4.0)],
        "inference": entry([1, 20, 1, 8], 0.5, 0.75),
    }


def test_kernel_ratios_and_table():
    out = accelerator.kernel_ratios(_kernel_results())
    assert out == {
        "AntisymmetricRNN kernel/loop B8 T20 m1 n8": 0.25,
        "GatedAntisymmetricRNN kernel/loop B8 T20 m1 n8": 0.375,
        "gated/ungated kernel B8 T20 m1 n8": 3.0,
        "AntisymmetricRNN kernel/loop B8 T80 m1 n8": 0.625,
        "GatedAntisymmetricRNN kernel/loop B8 T80 m1 n8": 0.5,
        "gated/ungated kernel B8 T80 m1 n8": 1.6,
        "kernel T80/T20": 2.5,
    }
    one = {"training": _kernel_results()["training"][:1]}
    assert "kernel T20/T20" not in accelerator.kernel_ratios(one)
    assert accelerator.kernel_ratios({}) == {}
    lines = accelerator.kernel_markdown(_kernel_results())
    assert lines[0] == ""
    assert lines[1] == (
        "| fused kernel (s, median) | AntisymmetricRNN|fused_kernel=True | "
        "AntisymmetricRNN|fused_kernel=False | GatedAntisymmetricRNN|fused_kernel=True | "
        "GatedAntisymmetricRNN|fused_kernel=False |"
    )
    assert lines[3:] == [
        "| training B8 T20 m1 n8 | 1.0000 | 4.0000 | 3.0000 | 8.0000 |",
        "| training B8 T80 m1 n8 | 2.5000 | 4.0000 | 4.0000 | 8.0000 |",
        "| inference B1 T20 | 0.5000 | 4.0000 | 0.7500 | 8.0000 |",
    ]
    assert accelerator.kernel_markdown(None) == ["", "fused kernel: not run"]
    assert accelerator.kernel_markdown({"skipped": "no GPU"}) == ["", "fused kernel: no GPU"]


def _accelerator_results(memory):
    training = [{**_training_entry(8, 20, 1, 8), "shape": [8, 20, 1, 8]}]
    return {
        "environment": {"backend": "jax", "device": "gpu"},
        "training": training,
        "inference": [{"batch": 1, "steps": 20,
                       "times": {name: _timing(0.25 * (i + 1)) for i, name in enumerate(LAYERS)}}],
        "memory": {"shape": [8, 30, 1, 8], "layers": memory},
        "kernel": _kernel_results(),
    }  # fmt: skip


def test_accelerator_ratios_and_markdown():
    memory = {name: {"peak_growth_mib": float(i + 1)} for i, name in enumerate(LAYERS)}
    results = _accelerator_results(memory)
    out = accelerator.ratios(results)
    assert out["B8 T20 m1 n8"] == tables.training_ratios(results["training"][0])
    assert out["gated/ungated kernel B8 T20 m1 n8"] == 3.0
    # LSTM is the sixth layer: peak 6.
    assert out["AntisymmetricRNN peak memory/LSTM"] == pytest.approx(1 / 6)
    assert out["GatedAntisymmetricRNN peak memory/LSTM"] == pytest.approx(2 / 6)
    assert out["RNN(AntisymmetricCell) peak memory/LSTM"] == pytest.approx(3 / 6)
    assert "GRU peak memory/LSTM" not in out
    text = accelerator.markdown({"jax": results})
    assert text.startswith('### jax on gpu\n\n`{"backend": "jax", "device": "gpu"}`\n\n')
    assert "| inference B1 T20 (s) | median |" in text and "| GRU | 1.2500 |" in text
    assert "| peak memory [8, 30, 1, 8] | growth (MiB) |" in text and "| LSTM | 6.0 |" in text
    assert "| AntisymmetricRNN peak memory/LSTM | 0.167 |" in text
    assert text.index("| fused kernel (s, median)") < text.index("| ratio (same run, medians)")


def test_accelerator_leaves_out_memory_it_could_not_measure():
    results = _accelerator_results(dict.fromkeys(LAYERS))  # None on a CPU
    del results["kernel"]
    assert not any("memory" in key for key in accelerator.ratios(results))
    text = accelerator.markdown({"jax": results})
    assert "peak memory" not in text
    assert "fused kernel: not run" in text
    no_growth = {name: {"peak_growth_mib": 1.0} for name in LAYERS}
    no_growth["LSTM"] = {"peak_growth_mib": 0.0}
    assert not any("memory" in key for key in accelerator.ratios(_accelerator_results(no_growth)))


def test_accelerator_markdown_with_a_hoist_section_and_no_inference():
    results = _accelerator_results({name: {"peak_growth_mib": 1.0} for name in LAYERS})
    del results["inference"]
    results["hoist"] = _run_results()["hoist"]
    text = accelerator.markdown({"torch": results})
    assert "| input projection, training step B8 T20 m9 n8 (s) | median |" in text
    assert "| GatedAntisymmetricRNN, hoist=False | 5.0000 |" in text
    assert "inference" not in text.split("| fused kernel")[0]


def test_the_floor_is_a_timed_chain_of_products():
    timing = run.floor_time(batch=2, steps=3, units=4, repeats=3, warmup=1)
    assert timing["repeats"] == 3
    assert 0 < timing["min"] <= timing["median"] <= timing["max"]
