"""The backends and trainers in this process: `select.start`'s choice, each backend's
trainer and strategy, and `KerasTrainer`'s `.npz` checkpoints (written, pruned, restored,
torn) on TensorFlow.

The JAX and PyTorch runs of `tests/test_trainers.py` train in subprocesses; these tests
call the same code here, where a wrong argument or a skipped variable is seen at once.
"""

import json
import os
import socket

import keras
import numpy as np
import pytest

from apputil.errors import UsageError
from training.backends import select, strategies
from training.backends.backend import Backend
from training.backends.cluster import Cluster, Processes
from training.backends.distributions import JaxBackend, TorchBackend
from training.backends.launch_config import LaunchConfig
from training.backends.strategies import TensorFlowBackend
from training.backends.trainer_keras import KerasTrainer
from training.backends.trainer_tf import TFTrainer
from training.errors import StrategyError
from training.tasks import catalog as tasks
from training.tasks.optimizers import make_optimizer


def test_start_makes_the_backend_of_the_keras_backend_with_the_launch_s_strategy(monkeypatch):
    made = select.start(LaunchConfig(strategy="default"))
    assert type(made) is TensorFlowBackend and made.requested == "default"
    assert (made.strategy_name, made.replicas, made.chief, made.label) == (
        "default", 1, True, "chief"
    )  # fmt: skip
    # One process without a coordinator: nothing to join.
    for name, kind in (("jax", JaxBackend), ("torch", TorchBackend)):
        monkeypatch.setattr(keras.backend, "backend", lambda name=name: name)
        made = select.start(LaunchConfig(strategy="default"))
        assert type(made) is kind and made.strategy is None and made.requested == "default"
        assert not made.cluster.multi_process
    with pytest.raises(StrategyError) as refused:
        select.start(LaunchConfig(strategy="mirrored"))
    assert str(refused.value) == (
        "Received an invalid value for argument `--strategy`, expected one of auto, default on "
        "the torch backend, got 'mirrored'."
    )


def test_tensorflow_never_joins_the_jax_processes_of_a_launch():
    """The coordinator settings are JAX's: on TensorFlow a launch that names one starts no
    connection (the port below has no listener, and nothing waits for it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launch = LaunchConfig(strategy="default", coordinator=f"127.0.0.1:{port}", num_processes=2,
                          process_id=1, connect_timeout=1)  # fmt: skip
    assert type(select.start(launch)) is TensorFlowBackend


def _task_examples():
    task = tasks.get_task("digits")
    return task, *task.examples("train")


def _build(seed=0):
    def build():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [keras.Input((64, 1)), keras.layers.SimpleRNN(4), keras.layers.Dense(10)]
        )
        return model, make_optimizer("adam", 0.01)

    return build


def test_each_backend_makes_its_trainer_with_everything_it_is_given(tmp_path):
    task, inputs, targets = _task_examples()
    settings = dict(batch_size=8, seed=3, checkpoint_dir=str(tmp_path / "c"), jit_compile=True)
    for backend, kind in ((TensorFlowBackend(), TFTrainer), (JaxBackend(), KerasTrainer),
                          (TorchBackend(), KerasTrainer)):  # fmt: skip
        trainer = backend.make_trainer(task, _build(), inputs, targets, **settings)
        assert type(trainer) is kind
        assert (trainer.batch_size, trainer.checkpoint_dir) == (8, str(tmp_path / "c"))
        assert trainer.batches.seed == 3
    assert TensorFlowBackend().make_trainer(task, _build(), inputs, targets,
                                            **settings).jit_compile is True  # fmt: skip
    with pytest.raises(NotImplementedError):
        Backend().make_trainer(task, _build(), inputs, targets, batch_size=8, seed=3)


def test_keras_tuner_gets_the_tensorflow_strategy_and_nothing_elsewhere():
    tensorflow = TensorFlowBackend()
    assert tensorflow.tuner_strategy() is tensorflow.strategy
    assert JaxBackend().tuner_strategy() is None and TorchBackend().tuner_strategy() is None


def _keras_trainer(checkpoint_dir, seed=0, distribution=None, backend=None):
    task, inputs, targets = _task_examples()
    backend = backend or JaxBackend(distribution)
    return KerasTrainer(task, _build(seed), inputs, targets, backend=backend, batch_size=16,
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
    import jax

    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    trainer = _keras_trainer(None)
    assert (trainer.chief, trainer.label, trainer.distributed) == (False, "worker1", True)
    # One process elsewhere.
    torch = TorchBackend()
    assert (torch.chief, torch.label, torch.distributed) == (True, "chief", False)


def test_keras_trainer_sets_its_distribution_and_feeds_this_process_s_rows(
    monkeypatch, held_distribution
):
    asked = []

    class SecondProcess(JaxBackend):
        def process_rows(self, batch_size):
            asked.append((self.strategy, batch_size))
            return slice(4, 12)  # as for the second of two processes with 8 rows each

    trainer = _keras_trainer(None, backend=SecondProcess(held_distribution))
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
    cluster = Cluster()
    cluster.record(Processes("127.0.0.1:1", 2, 0), 2)
    gathered = []

    def allgather(value):  # this process restored `value`, a second one step 0
        gathered.append(int(value))
        return np.asarray([int(value), 0])

    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    with pytest.raises(StrategyError) as refused:
        _keras_trainer(str(tmp_path), seed=1, backend=JaxBackend(None, cluster=cluster)).restore()
    assert gathered == [2]
    assert str(refused.value) == (
        "the processes disagree on the restored step (process 0: 2, process 1: 0); every "
        "process must read the chief's checkpoints: give them a shared --output-dir or copy "
        "the chief's checkpoints/ to each"
    )


# --- The TensorFlow strategies and the JAX processes in this process, with stand-ins for what
# cannot start here (a cluster, a CPU split after TensorFlow started) ----------------------


def test_the_named_tensorflow_strategies_and_their_public_names():
    import tensorflow as tf

    default = strategies.make_strategy("default")
    assert default is tf.distribute.get_strategy()
    assert strategies.strategy_name(default) == "default"
    mirrored = strategies.make_strategy("mirrored")  # over this process's one CPU
    assert strategies.strategy_name(mirrored) == "MirroredStrategy"
    assert mirrored.num_replicas_in_sync == 1
    with pytest.raises(StrategyError) as refused:
        strategies.make_strategy("data_parallel")
    assert str(refused.value) == (
        "Received an invalid value for argument `--strategy`, expected one of auto, default, "
        "mirrored, multi_worker, tpu on the tensorflow backend, got 'data_parallel'."
    )


class _StandInMultiWorker:
    """`tf.distribute.MultiWorkerMirroredStrategy` without its cluster."""

    num_replicas_in_sync = 2

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
    strategy = strategies.make_strategy("auto")
    assert isinstance(strategy, _StandInMultiWorker)
    assert isinstance(strategies.make_strategy("multi_worker"), _StandInMultiWorker)
    assert strategies.task_label(strategy) == "worker1"
    assert strategies.task_label(strategies.make_strategy("default")) == "chief"
    stand_in_multi_worker.setenv("TF_CONFIG", json.dumps({"task": {"type": "worker"}}))
    with pytest.raises(StrategyError, match="needs TF_CONFIG with a cluster"):
        strategies.make_strategy("multi_worker")
    stand_in_multi_worker.delenv("TF_CONFIG")
    assert strategies.make_strategy("auto") is strategies.make_strategy("default")


def test_the_chief_process_on_tensorflow_is_the_strategy_s_chief(stand_in_multi_worker):
    worker = TensorFlowBackend(_StandInMultiWorker())
    assert (worker.chief, worker.label, worker.distributed) == (False, "worker1", True)
    with pytest.raises(UsageError, match="argument `--strategy`, expected a single-worker"):
        worker.tuner_strategy()  # keras-tuner runs each trial on one worker


def test_a_process_count_from_the_environment_must_be_an_integer(monkeypatch):
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "two")
    with pytest.raises(StrategyError) as refused:
        Processes.resolve()
    assert str(refused.value) == (
        "Received an invalid value for argument `KERAS_DISTRIBUTION_NUM_PROCESSES`, expected "
        "an integer, got 'two'."
    )


def test_on_jax_a_process_other_than_0_waits_for_the_coordinator_as_long_as_it_may_connect(
    monkeypatch,
):
    """A coordinator address where nothing listens: process 1 waits the connect timeout,
    then refuses in one line. Without a coordinator there is one process, nothing to join."""
    import time

    import jax

    monkeypatch.setattr(jax.config, "update", lambda *args: None)  # no gloo in this process
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster, started = Cluster(), time.monotonic()
    with pytest.raises(StrategyError) as refused:
        cluster.join(Processes(f"127.0.0.1:{port}", 2, 1), connect_timeout=1)
    assert 1 <= time.monotonic() - started < 10
    assert str(refused.value).startswith(
        f"process 1 of 2 could not join the coordinator at 127.0.0.1:{port} within 1 s "
        "(no coordinator answers: "
    )
    assert cluster.join(Processes(None, None, None)) is False and not cluster.multi_process


def test_a_cpu_split_on_tensorflow_asks_for_that_many_logical_devices(monkeypatch):
    import tensorflow as tf

    asked = []
    monkeypatch.setattr(
        tf.config, "set_logical_device_configuration", lambda d, c: asked.append((d, c))
    )
    strategies.split_cpu(3)
    strategies.split_cpu(1)  # one device: nothing to split
    ((device, configurations),) = asked
    assert device.device_type == "CPU"
    assert configurations == [tf.config.LogicalDeviceConfiguration()] * 3


def test_processes_come_from_the_flags_else_keras_variables_else_jax_s(monkeypatch):
    for name in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "3")
    monkeypatch.setenv("KERAS_DISTRIBUTION_PROCESS_ID", "2")
    assert Processes.resolve() == Processes(None, 3, 2)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.9:99")
    assert Processes.resolve().coordinator == "10.0.0.9:99"
    monkeypatch.setenv("KERAS_DISTRIBUTION_JOB_ADDRESSES", "10.0.0.1:1234, 10.0.0.2:1234")
    assert Processes.resolve() == Processes("10.0.0.1:1234", 3, 2)
    flags = Processes.resolve("127.0.0.1:5", 4, 0)
    assert flags == Processes("127.0.0.1:5", 4, 0)


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
    kind, resolver = strategies.make_strategy("tpu", tpu="grpc://10.0.0.1:8470")
    assert kind == "tpu" and isinstance(resolver, Resolver)
    assert calls == [
        ("resolve", "grpc://10.0.0.1:8470"), ("connect", resolver), ("initialize", resolver),
    ]  # fmt: skip
    calls.clear()
    strategies.make_strategy("tpu")
    assert calls[0] == ("resolve", "")  # the resolver's own discovery (TPU_NAME, metadata)

    def none_found(tpu):
        raise ValueError("Please provide a TPU Name to connect to.\nsecond line")

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", none_found)
    with pytest.raises(StrategyError) as refused:
        strategies.make_strategy("tpu")
    assert str(refused.value) == "no TPU found (Please provide a TPU Name to connect to.)"
