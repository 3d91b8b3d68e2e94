"""The trainers in this process: `make_trainer`'s choice and arguments on each backend,
and `KerasTrainer`'s `.npz` checkpoints (written, pruned, restored, torn) on TensorFlow.

The JAX and PyTorch runs of `tests/test_trainers.py` train in subprocesses; these tests
call the same code here, where a wrong argument or a skipped variable is seen at once.
"""

import json
import os

import keras
import numpy as np
import pytest

from training import distribution, tasks, trainer_keras, trainer_tf, trainers
from training.optimizers import make_optimizer
from training.trainer_keras import KerasTrainer


class _Recorder:
    """Stands in for a trainer class: records how it was made."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _made(monkeypatch, backend, **kwargs):
    made = []
    monkeypatch.setattr(keras.backend, "backend", lambda: backend)
    monkeypatch.setattr(distribution, "make", lambda *a, **k: made.append((a, k)) or f"made:{a[0]}")
    monkeypatch.setattr(trainer_tf, "TFTrainer", _Recorder)
    monkeypatch.setattr(trainers, "KerasTrainer", _Recorder)
    trainer = trainers.make_trainer("task", "build", "x", "y", batch_size=8, seed=3, **kwargs)
    return trainer, made


def test_make_trainer_passes_everything_to_the_keras_trainer_off_tensorflow(monkeypatch):
    # One test for both other backends, its name free of theirs: the mutation runs leave
    # out tests named after a backend (those run it in a child process).
    for backend in ("jax", "torch"):
        trainer, made = _made(monkeypatch, backend, strategy="mirrored", checkpoint_dir="c",
                              jit_compile=True, tpu="ignored")  # fmt: skip
        assert made == [(("mirrored",), {})], backend  # no `tpu` outside TensorFlow
        assert trainer.args == ("task", "build", "x", "y")
        assert trainer.kwargs == {"distribution": "made:mirrored", "batch_size": 8, "seed": 3,
                                  "checkpoint_dir": "c", "jit_compile": True}  # fmt: skip


def test_make_trainer_defaults_on_tensorflow(monkeypatch):
    trainer, made = _made(monkeypatch, "tensorflow")
    assert made == [(("auto",), {"tpu": None})]
    assert trainer.args == ("task", "build", "x", "y")
    assert trainer.kwargs == {"strategy": "made:auto", "batch_size": 8, "seed": 3,
                              "checkpoint_dir": None, "jit_compile": False}  # fmt: skip


def test_make_trainer_passes_the_tpu_and_a_made_strategy_as_is(monkeypatch):
    _, made = _made(monkeypatch, "tensorflow", strategy="tpu", tpu="grpc://10.0.0.1:8470")
    assert made == [(("tpu",), {"tpu": "grpc://10.0.0.1:8470"})]
    strategy = object()
    trainer, made = _made(monkeypatch, "tensorflow", strategy=strategy)
    assert made == [] and trainer.kwargs["strategy"] is strategy
    trainer, made = _made(monkeypatch, "jax", strategy=strategy)
    assert made == [] and trainer.kwargs["distribution"] is strategy


def _keras_trainer(checkpoint_dir, seed=0, distribution=None):
    task = tasks.get_task("digits")
    inputs, targets = task.examples("train")

    def build():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [keras.Input((64, 1)), keras.layers.SimpleRNN(4), keras.layers.Dense(10)]
        )
        return model, make_optimizer("adam", 0.01)

    return KerasTrainer(task, build, inputs, targets, distribution=distribution, batch_size=16,
                        seed=0, checkpoint_dir=checkpoint_dir)  # fmt: skip


def _state(trainer):
    variables = trainer.model.weights + trainer.optimizer.variables
    return [keras.ops.convert_to_numpy(v) for v in variables]


def test_keras_trainer_checkpoints_keep_the_last_three_and_restore_every_variable(tmp_path):
    folder = tmp_path / "checkpoints"
    trainer = _keras_trainer(str(folder))
    saved = {}
    for step in range(1, 9):
        trainer.step()
        if step % 2 == 0:
            trainer.save(step)
            saved[step] = _state(trainer)
    trainer.save(8)  # saved again (a resumed run's first save): listed once
    index = json.loads((folder / "checkpoint.json").read_text())
    assert index == {"latest": "ckpt-8.npz", "all": ["ckpt-4.npz", "ckpt-6.npz", "ckpt-8.npz"]}
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "ckpt-4.npz", "ckpt-6.npz",
                                          "ckpt-8.npz"]  # fmt: skip
    # A fresh trainer (other initial weights) comes back to step 8 exactly.
    fresh = _keras_trainer(str(folder), seed=1)
    assert any(not np.array_equal(a, b) for a, b in zip(_state(fresh), saved[8], strict=True))
    assert fresh.restore() == (8, str(folder / "ckpt-8.npz"))
    for restored, expected in zip(_state(fresh), saved[8], strict=True):
        np.testing.assert_array_equal(restored, expected)
    # ... and trains on from there as the original does.
    assert fresh.step() == pytest.approx(trainer.step(), rel=1e-6)


def test_keras_trainer_skips_a_torn_checkpoint_for_the_one_before(tmp_path, capsys):
    folder = tmp_path / "checkpoints"
    trainer = _keras_trainer(str(folder))
    for step in (1, 2):
        trainer.step()
        trainer.save(step)
        if step == 1:
            first = _state(trainer)
    newest = folder / "ckpt-2.npz"
    newest.write_bytes(newest.read_bytes()[:100])  # torn by a crash of the disk
    fresh = _keras_trainer(str(folder), seed=1)
    assert fresh.restore() == (1, str(folder / "ckpt-1.npz"))
    assert f"skipping unreadable checkpoint {newest}" in capsys.readouterr().out
    for restored, expected in zip(_state(fresh), first, strict=True):
        np.testing.assert_array_equal(restored, expected)


def test_keras_trainer_restore_without_checkpoints(tmp_path):
    none = _keras_trainer(None)
    none.save(3)  # no folder: nothing written, nothing to restore
    assert none.restore() == (0, None)
    empty = _keras_trainer(str(tmp_path / "empty"))
    assert empty.restore() == (0, None)
    assert not (tmp_path / "empty").exists()


def test_keras_trainer_save_model_writes_the_trained_weights_uncompiled(tmp_path):
    trainer = _keras_trainer(None)
    trainer.step()
    path = str(tmp_path / "model.keras")
    trainer.save_model(path)
    loaded = keras.models.load_model(path)
    assert not loaded.compiled
    x = np.random.default_rng(0).random((3, 64, 1), dtype=np.float32)
    np.testing.assert_allclose(loaded.predict_on_batch(x), trainer.predict(x), rtol=1e-6)


@pytest.fixture
def held_distribution():
    """A one-device `DataParallel`; Keras' global distribution is unset again after."""
    yield keras.distribution.DataParallel(devices=["cpu:0"])
    keras.distribution.set_distribution(None)


def test_keras_trainer_save_model_copies_outside_the_distribution_and_restores_it(
    tmp_path, monkeypatch, held_distribution
):
    trainer = _keras_trainer(None, distribution=held_distribution)
    seen = []
    real_from_config = keras.Sequential.from_config

    def from_config(config, **kwargs):
        seen.append(keras.distribution.distribution())
        return real_from_config(config, **kwargs)

    monkeypatch.setattr(keras.Sequential, "from_config", from_config)
    trainer.save_model(str(tmp_path / "model.keras"))
    # The copy is made on this process alone; the training goes on distributed.
    assert seen == [None]
    assert keras.distribution.distribution() is held_distribution


def test_keras_trainer_in_one_process_is_the_undistributed_chief():
    trainer = _keras_trainer(None)
    assert (trainer.chief, trainer.label, trainer.distributed) == (True, "chief", False)
    assert (trainer.strategy_name, trainer.replicas) == ("default", 1)


def test_keras_trainer_of_a_later_process_is_a_distributed_worker(monkeypatch):
    monkeypatch.setattr(trainer_keras, "_process_index", lambda: 1)
    monkeypatch.setattr(trainer_keras, "_process_count", lambda: 2)
    trainer = _keras_trainer(None)
    assert (trainer.chief, trainer.label, trainer.distributed) == (False, "worker1", True)


def test_process_index_and_count_are_the_backend_s_own_or_one_process(monkeypatch):
    import jax

    monkeypatch.setattr(jax, "process_index", lambda: 3)
    monkeypatch.setattr(jax, "process_count", lambda: 4)
    for backend, expected in (("jax", (3, 4)), ("tensorflow", (0, 1)), ("torch", (0, 1))):
        monkeypatch.setattr(keras.backend, "backend", lambda b=backend: b)
        assert (trainer_keras._process_index(), trainer_keras._process_count()) == expected


def test_keras_trainer_sets_its_distribution_and_feeds_this_process_s_rows(
    monkeypatch, held_distribution
):
    asked = []

    def process_rows(distribution, batch_size):
        asked.append((distribution, batch_size))
        return slice(4, 12)  # as for the second of two processes with 8 rows each

    monkeypatch.setattr(trainer_keras, "process_rows", process_rows)
    trainer = _keras_trainer(None, distribution=held_distribution)
    assert keras.distribution.distribution() is held_distribution
    assert trainer.distribution is held_distribution and asked == [(held_distribution, 16)]
    assert (trainer.strategy_name, trainer.replicas) == ("DataParallel", 1)
    fed = []

    def train_on_batch(x, y, **kwargs):
        fed.append((x, y))
        return {"loss": 0.0, "accuracy": 0.0}

    trainer.model.train_on_batch = train_on_batch
    trainer.step()
    x, y = trainer.batches(0)
    np.testing.assert_array_equal(fed[0][0], x[4:12])
    np.testing.assert_array_equal(fed[0][1], y[4:12])


def test_keras_trainer_checkpoint_arrays_are_named_by_owner_and_position(tmp_path):
    """The `.npz` layout that older checkpoints have too: `model/i` and `optimizer/i`."""
    trainer = _keras_trainer(str(tmp_path))
    trainer.step()
    trainer.save(1)
    with np.load(tmp_path / "ckpt-1.npz") as arrays:
        stored = {key: arrays[key] for key in arrays.files}
    expected = {f"model/{i}": v for i, v in enumerate(trainer.model.weights)}
    expected.update({f"optimizer/{i}": v for i, v in enumerate(trainer.optimizer.variables)})
    assert sorted(stored) == sorted(expected)
    for key, variable in expected.items():
        np.testing.assert_array_equal(stored[key], keras.ops.convert_to_numpy(variable))


def test_processes_that_restored_different_steps_are_refused(tmp_path, monkeypatch):
    """Every process must go on from the chief's step: a process that restored another
    step (it did not see the chief's checkpoints) stops the run with the remedy."""
    from jax.experimental import multihost_utils

    trainer = _keras_trainer(str(tmp_path))
    trainer.step()
    trainer.step()
    trainer.save(2)
    monkeypatch.setattr(distribution, "multi_process", lambda: True)
    gathered = []

    def allgather(value):  # this process restored `value`, a second one step 0
        gathered.append(int(value))
        return np.asarray([int(value), 0])

    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    with pytest.raises(distribution.StrategyError) as refused:
        _keras_trainer(str(tmp_path), seed=1).restore()
    assert gathered == [2]
    assert str(refused.value) == (
        "the processes disagree on the restored step (process 0: 2, process 1: 0); every "
        "process must read the chief's checkpoints: give them a shared --output-dir or copy "
        "the chief's checkpoints/ to each"
    )


# --- training.distribution in this process: the strategy names, with stand-ins for what
# cannot start here (a cluster, a CPU split after TensorFlow started) ----------------------


def test_the_named_tensorflow_strategies_and_their_public_names():
    import tensorflow as tf

    default = distribution.make_strategy("default")
    assert default is tf.distribute.get_strategy()
    assert distribution.strategy_name(default) == "default"
    mirrored = distribution.make_strategy("mirrored")  # over this process's one CPU
    assert distribution.strategy_name(mirrored) == "MirroredStrategy"
    assert mirrored.num_replicas_in_sync == 1
    with pytest.raises(distribution.StrategyError) as refused:
        distribution.make_strategy("data_parallel")
    assert str(refused.value) == (
        "Received an invalid value for argument `--strategy`, expected one of auto, default, "
        "mirrored, multi_worker, tpu on the tensorflow backend, got 'data_parallel'."
    )


class _StandInMultiWorker:
    """`tf.distribute.MultiWorkerMirroredStrategy` without its cluster."""

    def __init__(self):
        self.cluster_resolver = type("Resolver", (), {"task_type": "worker", "task_id": 1})()


@pytest.fixture
def stand_in_multi_worker(monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", _StandInMultiWorker)
    monkeypatch.delenv("TPU_NAME", raising=False)
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    task = {"type": "worker", "index": 1}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    return monkeypatch


def test_auto_picks_multi_worker_for_a_cluster_of_several_workers(stand_in_multi_worker):
    strategy = distribution.make_strategy("auto")
    assert isinstance(strategy, _StandInMultiWorker)
    assert isinstance(distribution.make_strategy("multi_worker"), _StandInMultiWorker)
    assert distribution.task_label(strategy) == "worker1"
    assert distribution.task_label(distribution.make_strategy("default")) == "chief"
    stand_in_multi_worker.setenv("TF_CONFIG", json.dumps({"task": {"type": "worker"}}))
    with pytest.raises(distribution.StrategyError, match="needs TF_CONFIG with a cluster"):
        distribution.make_strategy("multi_worker")
    stand_in_multi_worker.delenv("TF_CONFIG")
    assert distribution.make_strategy("auto") is distribution.make_strategy("default")


def test_the_chief_process_on_tensorflow_is_the_strategy_s_chief(monkeypatch):
    monkeypatch.setattr(distribution, "is_chief", lambda strategy: strategy == "chief")
    assert distribution.chief_process("chief") is True
    assert distribution.chief_process("worker") is False


def test_a_process_count_from_the_environment_must_be_an_integer(monkeypatch):
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "two")
    with pytest.raises(distribution.StrategyError) as refused:
        distribution.Processes.resolve()
    assert str(refused.value) == (
        "Received an invalid value for argument `KERAS_DISTRIBUTION_NUM_PROCESSES`, expected "
        "an integer, got 'two'."
    )


def test_processes_are_connected_only_on_jax(monkeypatch):
    monkeypatch.setattr(distribution, "_wait_for_coordinator", lambda *a: pytest.fail("waited"))
    for index in (0, 1):  # process 1 would wait for the coordinator first
        processes = distribution.Processes("127.0.0.1:1234", 2, index)
        assert distribution.initialize_processes(processes) is False


def test_on_jax_a_process_other_than_0_waits_for_the_coordinator_as_long_as_it_may_connect(
    monkeypatch,
):
    """JAX's calls replaced by stand-ins; the wait stops the connection where it starts.
    Without a coordinator there is one process and nothing to connect."""
    import jax
    import keras

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.config, "update", lambda *args: None)
    waited = []

    def wait(*args):
        waited.append(args)
        raise distribution.StrategyError("no coordinator answers")

    monkeypatch.setattr(distribution, "_wait_for_coordinator", wait)
    processes = distribution.Processes("127.0.0.1:1234", 2, 1)
    with pytest.raises(distribution.StrategyError, match="no coordinator answers"):
        distribution.initialize_processes(processes, connect_timeout=7)
    assert waited == [("127.0.0.1", 1234, processes, 7)]
    assert distribution.initialize_processes(distribution.Processes(None, None, None)) is False


def test_a_cpu_split_on_tensorflow_asks_for_that_many_logical_devices(monkeypatch):
    import tensorflow as tf

    asked = []
    monkeypatch.setattr(
        tf.config, "set_logical_device_configuration", lambda d, c: asked.append((d, c))
    )
    distribution.split_cpu(3)
    distribution.split_cpu(1)  # one device: nothing to split
    ((device, configurations),) = asked
    assert device.device_type == "CPU"
    assert configurations == [tf.config.LogicalDeviceConfiguration()] * 3


def test_processes_come_from_the_flags_else_keras_variables_else_jax_s(monkeypatch):
    for name in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "3")
    monkeypatch.setenv("KERAS_DISTRIBUTION_PROCESS_ID", "2")
    assert distribution.Processes.resolve() == distribution.Processes(None, 3, 2)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.9:99")
    assert distribution.Processes.resolve().coordinator == "10.0.0.9:99"
    monkeypatch.setenv("KERAS_DISTRIBUTION_JOB_ADDRESSES", "10.0.0.1:1234, 10.0.0.2:1234")
    assert distribution.Processes.resolve() == distribution.Processes("10.0.0.1:1234", 3, 2)
    flags = distribution.Processes.resolve("127.0.0.1:5", 4, 0)
    assert flags == distribution.Processes("127.0.0.1:5", 4, 0)


def test_a_tpu_strategy_connects_to_and_initializes_the_tpu_it_resolves(monkeypatch):
    """TensorFlow's TPU calls replaced by stand-ins that record what they are given: the
    one resolver made for the address reaches the connection, the initialization and the
    strategy; one that finds no TPU is one line with the first line of why."""
    import tensorflow as tf

    calls = []

    class Resolver:
        def __init__(self, tpu):
            calls.append(("resolve", tpu))

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Resolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster",
                        lambda resolver: calls.append(("connect", resolver)))  # fmt: skip
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                        lambda resolver: calls.append(("initialize", resolver)))  # fmt: skip
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda resolver: ("tpu", resolver))
    kind, resolver = distribution.make_strategy("tpu", tpu="grpc://10.0.0.1:8470")
    assert kind == "tpu" and isinstance(resolver, Resolver)
    assert calls == [
        ("resolve", "grpc://10.0.0.1:8470"), ("connect", resolver), ("initialize", resolver),
    ]  # fmt: skip
    calls.clear()
    distribution.make_strategy("tpu")
    assert calls[0] == ("resolve", "")  # the resolver's own discovery (TPU_NAME, metadata)

    def none_found(tpu):
        raise ValueError("Please provide a TPU Name to connect to.\nsecond line")

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", none_found)
    with pytest.raises(distribution.StrategyError) as refused:
        distribution.make_strategy("tpu")
    assert str(refused.value) == "no TPU found (Please provide a TPU Name to connect to.)"
