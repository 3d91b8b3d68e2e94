"""The application's structure: no import cycles, light command-line modules, one config source."""

import json
import os
import subprocess
import sys
import types

import pytest

from training import options, train, tune
from training.backends.launch_config import LaunchConfig
from training.config import RunConfig, identity_fields, option_fields
from training.errors import DataError
from training.run import experiment
from training.sections import key_of
from training.tasks import catalog as tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import import_graph  # noqa: E402

from tests.limits import limit  # noqa: E402


def test_no_import_cycles_in_the_repository():
    # In a child: parsing every module builds many small objects, which a test process
    # holding large models makes the garbage collector slow to walk.
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "import_graph.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.rstrip().endswith("import cycles: 0")


def test_import_graph_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_graph.cycles(edges) == [["a", "b", "c"]]


def test_nothing_outside_the_test_suite_imports_it():
    """The library and the application (benchmarks too) run without the tests checked out."""
    packages = ("keras_antisym", "apputil", "training", "serving", "benchmarks", "tests")
    edges, _ = import_graph.scan(packages)
    into_tests = {
        module: sorted(target for target in targets if target.split(".")[0] == "tests")
        for module, targets in edges.items()
        if module.split(".")[0] != "tests"
    }
    assert {module: found for module, found in into_tests.items() if found} == {}
    assert "tests.helpers" in edges["tests.test_serving_export"]  # imports of tests are seen


def test_serving_has_two_wings_and_the_server_imports_the_exports_never_back():
    """`serving.exports` writes what `serving.local` reads: the exports import neither the
    local server nor the clients, and the shared modules at the top (names, codes, protos)
    import neither wing."""
    edges, _ = import_graph.scan(("serving",))

    def wing(module):
        parts = module.split(".")
        return parts[1] if len(parts) > 2 and parts[1] in ("exports", "local") else "top"

    crossings = {
        (module, target)
        for module, targets in edges.items()
        for target in targets
        if target.startswith("serving.") and wing(module) != wing(target)
    }
    shared = {"serving", "serving.names", "serving.codes", "serving.protos"}
    assert {(m, t) for m, t in crossings if wing(m) == "exports" and t not in shared} == set()
    assert {(m, t) for m, t in crossings if m in shared} == set()
    # The server reads the exports' warmup records: the one direction there is.
    assert ("serving.local.servable", "serving.exports.warmup") in crossings
    assert {wing(m) for m in edges if m.startswith("serving.")} == {"top", "exports", "local"}


LIGHT_MODULES = (
    "apputil", "apputil.cli", "apputil.errors", "apputil.files", "apputil.quiet",
    "training", "training.config", "training.sections", "training.options", "training.errors",
    "training.backends.launch_config",
    "training.search.space", "training.tasks.catalog", "training.train", "training.tune",
    "training.data", "training.paper.suite",
)  # fmt: skip


def test_command_modules_import_neither_keras_nor_tensorflow():
    code = (
        "import importlib, json, sys\n"
        f"for name in {LIGHT_MODULES!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch', "
        "'keras_tuner') if m in sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=limit(120)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == []


@pytest.mark.parametrize("command", ["training.train", "training.tune", "training.data"])
def test_help_and_usage_errors_answer_without_keras(command):
    # The command's main with a tracer on imports: --help must exit before Keras loads.
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['{command}', '--help']\n"
        "try:\n"
        f"    runpy.run_module('{command}', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "assert 'keras' not in sys.modules and 'tensorflow' not in sys.modules\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=limit(120)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.rstrip().endswith("ok")


def test_every_run_config_field_is_a_flag_with_its_default():
    parser = train.build_parser()
    args = parser.parse_args([])
    assert RunConfig.from_namespace(args) == RunConfig()
    assert LaunchConfig.from_namespace(args) == LaunchConfig()
    for field in option_fields():
        assert getattr(args, key_of(field)) == field.default, key_of(field)
    # And a value given on the command line reaches its field, with its type.
    given = parser.parse_args(["--sigma-w", "4", "--jit-compile", "--clipnorm", "0.5"])
    config = RunConfig.from_namespace(given).validate()
    assert (config.model.sigma_w, config.loop.jit_compile, config.optimizer.clipnorm) == (
        4.0, True, 0.5
    )  # fmt: skip


def test_the_tuner_shares_the_run_flags_and_holds_out_validation_data():
    args = tune.build_parser().parse_args([])
    assert args.validation_fraction == 0.1
    for name in ("task", "model", "units", "learning_rate", "batch_size", "eval_batch_size"):
        assert getattr(args, name) == RunConfig().to_dict()[name], name
    assert not hasattr(args, "steps")  # trials take --steps-per-trial


IDENTITY = {
    "task": "adding", "dataset": "fashion_mnist", "timesteps": 77, "seed": 5,
    "model": "gated", "units": 17, "epsilon": 0.5, "gamma": 0.5, "sigma_w": 3.0,
    "optimizer": "sgd", "learning_rate": 0.5, "momentum": 0.5, "clipnorm": 2.0,
    "batch_size": 7, "validation_fraction": 0.5, "dtype_policy": "mixed_bfloat16",
    "lr_schedule": "cosine", "warmup_steps": 3, "lr_floor": 0.5, "lr_decay_steps": 9,
    "lr_boundaries": "4", "lr_decay_factor": 0.5, "keep_best": True,
}  # fmt: skip


def test_resume_refuses_each_identity_field_and_allows_the_others(tmp_path):
    assert set(identity_fields()) == set(IDENTITY)
    record = {**RunConfig().to_dict(), "backend": "jax"}
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(record))  # JSON is YAML
    experiment.check_resumable(str(path), record)
    for name, value in IDENTITY.items():
        flag = "--" + name.replace("_", "-")
        with pytest.raises(ValueError, match=f"argument `{flag}`, expected .* as in"):
            experiment.check_resumable(str(path), {**record, name: value})
    free = {"steps": 9, "checkpoint_every": 3, "log_every": 1, "eval_every": 2,
            "eval_batch_size": 8, "diagnostics": 4, "strategy": "default", "cpu_devices": 2,
            "jit_compile": True, "data_dir": "elsewhere", "download": True, "tpu": "t",
            "change_on_resume": "learning_rate", "coordinator": "127.0.0.1:1",
            "num_processes": 2, "process_id": 1, "connect_timeout": 5,
            "heartbeat_timeout": 5}  # fmt: skip
    assert set(free) | set(IDENTITY) == {key_of(f) for f in option_fields()}
    experiment.check_resumable(str(path), {**record, **free})


@pytest.mark.parametrize(
    "content, message",
    [
        (b"a: &x [1, 2]\nb: *x\n", "aliases (*name) are not accepted"),
        (b"units: [1, 2\n", "is not valid YAML (line 2, column 1)"),
        (b"\xff\xfe\x00binary", "is not a UTF-8 text file"),
        (b"units: !!python/object:os.system x\n", "is not valid YAML"),
        (b"- a list\n", "is not a mapping of options"),
        (b"seed: 1.5\n", "argument `--seed`, expected an integer, got 1.5."),
        (b"jit_compile: 'false'\n", "argument `--jit-compile`, expected a boolean, got 'false'."),
        (b"data_dir: [a]\n", "argument `--data-dir`, expected a string (or null), got ['a']."),
        (b"units: 8\nnot_an_option: 1\n", "unknown option 'not_an_option'"),
    ],
)
def test_bad_config_files_are_one_line_usage_errors(tmp_path, capsys, content, message):
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(train.main(["--config", str(path), "--output-dir", str(tmp_path / "o")]))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert lines[0].startswith("python -m training.train: error: ")


def test_exponential_yaml_aliases_cannot_exhaust_memory(tmp_path):
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("units: *a9")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert len(path.read_bytes()) < 1000
    with pytest.raises(Exception, match="aliases"):
        options.read_yaml_mapping(str(path), "--config")


class _FakeBuilder:
    data_dir_root = "somewhere"

    def __init__(self, fail):
        self.fail = fail
        self.data_dir = "somewhere/mnist/3.0.1"

    def download_and_prepare(self):
        if self.fail:
            raise OSError("Name or service not known")


def _fake_tfds(fail, calls):
    def builder(name, data_dir=None):
        calls.append((name, data_dir))
        return _FakeBuilder(fail)

    download = types.SimpleNamespace(DownloadError=type("DownloadError", (Exception,), {}))
    return types.SimpleNamespace(builder=builder, download=download)


def test_prepare_downloads_through_tfds_and_says_how_to_do_it_offline(monkeypatch, capsys):
    from training import data

    calls = []
    monkeypatch.setattr(tasks, "_import_tfds", lambda name: _fake_tfds(False, calls))
    assert data.main(["prepare", "--dataset", "fashion_mnist", "--data-dir", "d"]) == 0
    assert calls == [("fashion_mnist", "d")]
    assert capsys.readouterr().out == "prepared fashion_mnist in somewhere/mnist/3.0.1\n"
    monkeypatch.setattr(tasks, "_import_tfds", lambda name: _fake_tfds(True, calls))
    assert data.main(["prepare", "--dataset", "mnist"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "cannot download TFDS data set 'mnist'" in err[0]
    assert "python -m training.data prepare --dataset mnist --data-dir DIR" in err[0]
    with pytest.raises(DataError):
        tasks.prepare("mnist")


def test_download_flag_prepares_the_tasks_data_set_before_training(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(tasks, "_import_tfds", lambda name: _fake_tfds(True, calls))
    config = RunConfig.of(task="pixel_mnist", dataset="fashion_mnist", download=True,
                       data_dir=str(tmp_path / "new"))  # fmt: skip
    with pytest.raises(DataError, match="cannot download"):
        experiment.train_and_evaluate(config.validate(), str(tmp_path / "run"), log=lambda _: 0)
    assert calls == [("fashion_mnist", str(tmp_path / "new"))]


def test_signature_and_input_names_are_spelled_only_in_serving_names():
    """The export contract's names have one home: a module spelling one of them as a
    literal would drift from what the exporter writes and the server reads."""
    from serving import names

    literals = {f'"{value}"' for value in (names.DEFAULT_SIGNATURE, names.PADDED_SIGNATURE)}
    found = []
    for package in ("serving", "training", "benchmarks", "apputil"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for file in files:
                path = os.path.join(folder, file)
                if not file.endswith(".py") or path == names.__file__:
                    continue
                with open(path) as f:
                    text = f.read()
                where = os.path.relpath(path, ROOT)
                found += [f"{where}: {literal}" for literal in literals if literal in text]
    assert found == []


def test_each_application_module_logs_under_its_own_name():
    """`logging.getLogger(__name__)`: a log line names the module it came from, and one
    logger's level (`serving`, `serving.local.repository`) selects a part of the application."""
    import re

    own = re.compile(r"^log = logging\.getLogger\((.*)\)$", re.M)
    found = {}
    for package in ("serving", "training", "apputil"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for file in files:
                if file.endswith(".py"):
                    path = os.path.join(folder, file)
                    with open(path) as f:
                        for name in own.findall(f.read()):
                            found[os.path.relpath(path, ROOT)] = name
    assert len(found) >= 6 and set(found.values()) == {"__name__"}, found


def test_the_modules_that_draw_leave_matplotlib_s_backend_as_the_user_chose():
    # Importing a module must not change process-wide state such as matplotlib's backend:
    # the figures draw on `Figure` objects, which need no backend.
    code = (
        "import matplotlib\n"
        "import training.figures, training.paper.plots, training.paper.report\n"
        "print(matplotlib.get_backend())\n"
    )
    env = {**os.environ, "MPLBACKEND": "svg", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=limit(180))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "svg"
