"""Every task's batches: shapes, dtypes, ranges, permutation, noise, determinism."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from training import errors
from training.backends.trainer_tf import training_dataset
from training.tasks import catalog as tasks


def _first_batch(task, split="train", batch_size=8, seed=0, **kwargs):
    inputs, targets = task.examples(split, **kwargs)
    x, y = tasks.TrainingBatches(task, inputs, targets, batch_size, seed)(0)
    return x, y, inputs, targets


@pytest.fixture
def mock_images():
    with tfds.testing.mock_data(num_examples=40):
        yield


@pytest.mark.parametrize(
    "name, timesteps, features",
    [("pixel_mnist", 784, 1), ("permuted_mnist", 784, 1), ("pixel_cifar10", 1024, 3)],
)
def test_pixel_tasks_shapes_and_ranges(mock_images, name, timesteps, features):
    task = tasks.get_task(name)
    x, y, inputs, _ = _first_batch(task)
    assert task.spec.timesteps == timesteps and task.spec.features == features
    assert x.shape == (8, timesteps, features) and x.dtype == np.float32
    assert y.dtype == np.int32 and np.all((0 <= y) & (y < 10))
    assert x.min() >= 0.0 and x.max() <= 1.0 and x.max() > 0.5


def test_pixel_mnist_is_scanline_order(mock_images):
    task = tasks.get_task("pixel_mnist")
    inputs, targets = task.examples("test")
    x, _ = task.make_batch(inputs[:2], targets[:2], (0, 0))
    np.testing.assert_allclose(x[:, :, 0], inputs[:2].reshape(2, 784) / 255.0, atol=1e-7)


def test_permutation_is_fixed_and_invertible(mock_images):
    plain, permuted = tasks.get_task("pixel_mnist"), tasks.get_task("permuted_mnist")
    again = tasks.get_task("permuted_mnist")
    perm = permuted.permutation
    np.testing.assert_array_equal(perm, again.permutation)
    assert sorted(perm) == list(range(784)) and not np.array_equal(perm, np.arange(784))
    assert permuted.spec.params["permutation_seed"] == tasks.PERMUTATION_SEED
    inputs, targets = plain.examples("test")
    a, _ = plain.make_batch(inputs[:3], targets[:3], (0, 0))
    b, _ = permuted.make_batch(inputs[:3], targets[:3], (0, 0))
    inverse = np.argsort(perm)
    np.testing.assert_array_equal(b[:, inverse], a)


@pytest.mark.parametrize(
    "name, steps, features, image_steps",
    [("noise_padded_cifar10", 1000, 96, 32), ("noise_padded_mnist", 1000, 28, 28)],
)
def test_noise_padding(mock_images, name, steps, features, image_steps):
    task = tasks.get_task(name)
    inputs, targets = task.examples("train")
    x, _ = task.make_batch(inputs[:16], targets[:16], (3, 4))
    assert x.shape == (16, steps, features) and x.dtype == np.float32
    rows = inputs[:16].reshape(16, image_steps, features) / 255.0
    np.testing.assert_allclose(x[:, :image_steps], rows, atol=1e-7)
    noise = x[:, image_steps:]
    assert abs(noise.mean()) < 0.01 and abs(noise.std() - 1.0) < 0.01
    # Independent across examples and steps: tiny correlations.
    assert abs(np.corrcoef(noise[0].ravel(), noise[1].ravel())[0, 1]) < 0.02
    x2, _ = task.make_batch(inputs[:16], targets[:16], (3, 4))
    np.testing.assert_array_equal(x2, x)  # same seed, same noise


@pytest.mark.parametrize("timesteps", [100, 200, 400, 800])
def test_noise_padding_length_is_a_parameter(mock_images, timesteps):
    task = tasks.get_task("noise_padded_cifar10", timesteps=timesteps)
    x, _, _, _ = _first_batch(task, batch_size=2)
    assert x.shape == (2, timesteps, 96)


def test_fashion_mnist_runs_the_mnist_tasks(mock_images):
    for name in ("pixel_mnist", "permuted_mnist", "noise_padded_mnist"):
        task = tasks.get_task(name, dataset="fashion_mnist")
        x, _, _, _ = _first_batch(task, batch_size=2)
        assert x.shape[0] == 2 and task.spec.params["dataset"] == "fashion_mnist"


def test_real_mnist_reads_offline(shared_tfds):
    task = tasks.get_task("pixel_mnist")
    inputs, targets = task.examples("test", data_dir=shared_tfds)
    # The shared test split: half of the official 10,000 digits, every class in it.
    assert inputs.shape == (5000, 28, 28, 1) and inputs.dtype == np.uint8
    assert set(np.unique(targets)) == set(range(10)) and np.bincount(targets).min() > 400
    x, y = tasks.TrainingBatches(task, inputs, targets, 128, 0)(0)
    assert x.shape == (128, 784, 1) and 0.0 <= x.min() and x.max() == 1.0
    # The train split is the whole official training set (read from its metadata, not
    # decoded: the tests read a few batches, not 60,000 digits).
    info = tfds.builder("mnist", data_dir=shared_tfds).info
    assert info.splits["train"].num_examples == 60000


def test_tfds_data_dir_environment_variable(monkeypatch, shared_tfds):
    monkeypatch.setenv("TFDS_DATA_DIR", shared_tfds)
    inputs, _ = tasks.get_task("pixel_mnist").examples("test")
    assert len(inputs) == 5000


def test_missing_data_gives_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(errors.DataError) as missing:
        tasks.get_task("pixel_cifar10").examples("test", data_dir=str(tmp_path))
    assert str(missing.value).startswith(
        f"TFDS data set 'cifar10' (test) is not prepared in {tmp_path}: pass --data-dir (or "
        "set TFDS_DATA_DIR) to a folder holding it, or fetch it with --download (needs the "
        "internet; or `python -m training.data prepare --dataset cifar10`). ("
    )
    with pytest.raises(errors.DataError) as no_folder:
        tasks.get_task("pixel_mnist").examples("test", data_dir=str(tmp_path / "missing"))
    from apputil.errors import shown  # a long path is cut to a bounded length

    assert str(no_folder.value) == (
        "Received an invalid value for argument `--data-dir`, expected an existing TFDS data "
        f"directory or a folder of .npz files, got {shown(str(tmp_path / 'missing'))}."
    )
    # No --data-dir and no TFDS_DATA_DIR: TFDS's default folder is named.
    monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(errors.DataError, match=r"is not prepared in ~/tensorflow_datasets: "):
        tasks.get_task("pixel_cifar10").examples("test")


def test_digits_task():
    task = tasks.get_task("digits")
    x, y, inputs, targets = _first_batch(task, batch_size=32)
    assert x.shape == (32, 64, 1) and 0.0 <= x.min() and x.max() <= 1.0
    test_inputs, _ = task.examples("test")
    assert len(inputs) + len(test_inputs) == 1797
    assert len(test_inputs) == int(1797 * 0.2)
    padded = tasks.get_task("digits", timesteps=100)
    xp, _, _, _ = _first_batch(padded, batch_size=4)
    assert xp.shape == (4, 100, 1) and xp[:, 64:].std() > 0.5


def test_validation_split_is_disjoint_and_fixed():
    task = tasks.get_task("digits")
    train, _ = task.examples("train", validation_fraction=0.25)
    val, _ = task.examples("validation", validation_fraction=0.25)
    everything, _ = task.examples("train")
    assert len(train) + len(val) == len(everything)
    flat = {row.tobytes() for row in everything}
    train_rows = {row.tobytes() for row in train}
    val_rows = [row.tobytes() for row in val]
    assert all(r in flat for r in val_rows)
    assert sum(r in train_rows for r in val_rows) <= 2  # duplicate images exist in digits
    val_again, _ = task.examples("validation", validation_fraction=0.25)
    np.testing.assert_array_equal(val, val_again)
    test, _ = task.examples("test", validation_fraction=0.25)
    assert len(test) == int(1797 * 0.2)


def test_a_validation_split_needs_a_validation_fraction():
    from apputil.errors import UsageError

    task = tasks.get_task("digits")
    for fraction in (0.0, None):
        with pytest.raises(UsageError) as refused:
            task.examples("validation", validation_fraction=fraction)
        assert str(refused.value) == (
            "Received an invalid value for argument `validation_fraction`, expected a float "
            "in (0, 1) for a validation split, got 0."
        )
    everything, _ = task.examples("train")
    assert len(task.examples("train", validation_fraction=0.0)[0]) == len(everything)


def test_adding_task():
    task = tasks.get_task("adding", timesteps=50)
    x, y, _, _ = _first_batch(task, batch_size=64)
    assert x.shape == (64, 50, 2) and y.shape == (64, 1)
    values, markers = x[..., 0], x[..., 1]
    assert np.all(markers.sum(1) == 2)
    assert np.all(markers[:, :25].sum(1) == 1) and np.all(markers[:, 25:].sum(1) == 1)
    np.testing.assert_allclose(y[:, 0], (values * markers).sum(1), atol=1e-6)
    assert 0 <= values.min() and values.max() <= 1
    assert x.dtype == np.float32 and y.dtype == np.float32  # what the model is fed


def test_copy_task():
    task = tasks.get_task("copy", timesteps=40)
    x, y, _, _ = _first_batch(task, batch_size=16)
    assert x.shape == (16, 40, 10) and y.shape == (16, 40)
    symbols = x.argmax(-1)
    assert np.all((symbols[:, :10] >= 1) & (symbols[:, :10] <= 8))
    assert np.all(symbols[:, 10:29] == 0) and np.all(symbols[:, 29] == 9)
    np.testing.assert_array_equal(y[:, -10:], symbols[:, :10])
    assert np.all(y[:, :-10] == 0)

    # Its spec: the ten recall steps are scored, and T is what defines the task.
    assert (task.spec.head, task.spec.scored_steps, task.spec.params) == (
        "per_step_classification",
        10,
        {"timesteps": 40},
    )
    # One-hot float32 inputs of ten symbols, a ten-way classification at every step.
    assert (task.spec.features, task.spec.num_outputs, x.dtype) == (10, 10, np.float32)
    assert tasks.get_task("copy").spec.timesteps == 120


@pytest.mark.parametrize("name", ["copy", "adding"])
def test_synthetic_splits_draw_disjoint_examples(name):
    """Train, validation and test ids never meet: no test sequence is seen in training."""
    task = tasks.get_task(name)
    ids = {split: task.examples(split)[0] for split in ("train", "validation", "test")}
    assert len(ids["validation"]) == 1024 and len(ids["test"]) == 2048
    for one, other in (("train", "validation"), ("train", "test"), ("validation", "test")):
        assert not set(ids[one].tolist()) & set(ids[other].tolist()), (one, other)
    # Evaluated with one seed, as a run evaluates both: still other sequences.
    (x_val, _), (x_test, _) = (
        next(tasks.evaluation_batches(task, ids[split], ids[split], 64, 0))
        for split in ("validation", "test")
    )
    assert x_val.shape == x_test.shape and not np.array_equal(x_val, x_test)
    again, _ = next(tasks.evaluation_batches(task, ids["test"], ids["test"], 64, 0))
    np.testing.assert_array_equal(again, x_test)  # and a split is the same every time


def test_training_batches_depend_only_on_seed_and_step():
    task = tasks.get_task("digits")
    inputs, targets = task.examples("train")
    steps_per_epoch = len(targets) // 32
    batches = tasks.TrainingBatches(task, inputs, targets, 32, seed=5)
    full = [batches(step) for step in range(steps_per_epoch + 3)]
    # A fresh instance asked for later steps first (as a resumed run): the same batches.
    resumed = tasks.TrainingBatches(task, inputs, targets, 32, seed=5)
    for step in (steps_per_epoch + 2, steps_per_epoch + 1, 3):
        np.testing.assert_array_equal(resumed(step)[0], full[step][0])
    # One epoch visits distinct examples; the next epoch uses a new order.
    first_epoch = np.concatenate([batches.order(0)[: steps_per_epoch * 32]])
    assert len(set(first_epoch.tolist())) == steps_per_epoch * 32
    other = tasks.TrainingBatches(task, inputs, targets, 32, seed=6)(0)[0]
    assert not np.array_equal(other, full[0][0])
    assert not np.array_equal(full[steps_per_epoch][0], full[0][0])
    # Batch s is rows [o·B, (o+1)·B) of epoch e's permutation.
    epoch, offset = divmod(steps_per_epoch + 1, steps_per_epoch)
    rows = batches.order(epoch)[offset * 32 : (offset + 1) * 32]
    np.testing.assert_array_equal(full[steps_per_epoch + 1][1], targets[rows])


def test_noise_of_a_batch_depends_on_its_step():
    task = tasks.get_task("digits", timesteps=80)
    inputs, targets = task.examples("train")
    batches = tasks.TrainingBatches(task, inputs, targets, 16, seed=0)
    steps_per_epoch = batches.steps_per_epoch
    # Same examples order position in two epochs, different steps: different noise.
    a, b = batches(1)[0][:, 64:], batches(steps_per_epoch + 1)[0][:, 64:]
    assert not np.array_equal(a, b) and a.shape == (16, 16, 1)


def test_tf_dataset_replica_slices_recompose_the_global_batch():
    task = tasks.get_task("adding", timesteps=20)
    inputs, targets = task.examples("train")
    batches = tasks.TrainingBatches(task, inputs, targets, 8, seed=1)
    whole = [batches(step) for step in range(3, 5)]
    slices = []
    for pipeline in range(2):  # 2 workers with 2 replicas each
        ds = training_dataset(
            batches, start_step=3, num_replicas=4, replica_ids=(2 * pipeline, 2 * pipeline + 1)
        )
        slices.append([x.numpy() for x, _ in ds.take(4)])
    for step in range(2):  # each pipeline yields its 2 slices of each step in order
        got = np.concatenate(
            slices[0][2 * step : 2 * step + 2] + slices[1][2 * step : 2 * step + 2]
        )
        np.testing.assert_array_equal(got, whole[step][0])


def test_evaluation_covers_every_example_once():
    task = tasks.get_task("digits")
    inputs, targets = task.examples("test")
    labels = np.concatenate([y for _, y in tasks.evaluation_batches(task, inputs, targets, 50, 0)])
    np.testing.assert_array_equal(labels, targets)


def test_exported_npz_loads_without_tfds(tmp_path, mock_images):
    task = tasks.get_task("pixel_mnist", dataset="fashion_mnist")
    from training import data

    data.export("fashion_mnist", None, str(tmp_path))
    for split in ("train", "test"):
        from_tfds = task.examples(split)
        from_npz = task.examples(split, data_dir=str(tmp_path))
        for a, b in zip(from_tfds, from_npz, strict=True):
            np.testing.assert_array_equal(a, b)


def test_export_command_writes_the_npz_it_names(tmp_path, mock_images, capsys):
    from training import data

    out = tmp_path / "exported"
    assert data.main(["export", "--dataset", "fashion_mnist", "--out", str(out)]) == 0
    path = out / "fashion_mnist.npz"
    assert capsys.readouterr().out == f"wrote {path}\n"
    with np.load(path) as arrays:
        assert sorted(arrays) == ["x_test", "x_train", "y_test", "y_train"]
        images, labels = tasks._load_images("fashion_mnist", "train", None)
        np.testing.assert_array_equal(arrays["x_train"], images)
        np.testing.assert_array_equal(arrays["y_train"], labels)


def test_export_refuses_a_data_set_it_cannot_write(tmp_path):
    from training import data

    with pytest.raises(errors.UsageError) as refused:
        data.export("kmnist", None, str(tmp_path))
    assert str(refused.value) == (
        "Received an invalid value for argument `--dataset`, expected one of mnist, "
        "fashion_mnist, cifar10, got 'kmnist'."
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "--out", "o"], "the following arguments are required: --dataset"),
        (["export", "--dataset", "mnist"], "the following arguments are required: --out"),
        (["prepare"], "the following arguments are required: --dataset"),
        (["export", "--dataset", "kmnist", "--out", "o"],
         "argument --dataset: invalid choice: 'kmnist' (choose from mnist, fashion_mnist, "
         "cifar10)"),
        ([], "the following arguments are required: command"),
    ],
)  # fmt: skip
def test_data_command_usage_errors(argv, message, capsys):
    from training import data

    with pytest.raises(SystemExit) as stopped:
        data.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.replace("'", "")
    assert len(err.splitlines()) == 1  # one line, naming the command
    assert err.startswith("python -m training.data")
    assert message.replace("'", "") in err


def test_data_command_help_documents_each_subcommand_and_flag(capsys):
    from training import data

    def help_of(argv):
        with pytest.raises(SystemExit) as stopped:
            data.main([*argv, "--help"])
        assert stopped.value.code == 0
        return " ".join(capsys.readouterr().out.split())

    top = help_of([])
    first, second = (" ".join(part.split()) for part in data.__doc__.split("\n\n")[:2])
    assert top.startswith("usage: python -m training.data [-h] {prepare,export} ...")
    assert first in top and second not in top  # the description: the first paragraph
    assert "prepare download and prepare a TFDS data set" in top
    assert "export TFDS data set -> DATASET.npz" in top
    data_dir = "--data-dir DATA_DIR TFDS data directory (or TFDS_DATA_DIR)"
    choices = "--dataset {mnist,fashion_mnist,cifar10}"
    prepare = help_of(["prepare"])
    assert prepare.startswith(f"usage: python -m training.data prepare [-h] {choices}")
    assert data_dir in prepare
    export = help_of(["export"])
    assert export.startswith(f"usage: python -m training.data export [-h] {choices}")
    assert "--out OUT folder for DATASET.npz" in export and data_dir in export


@pytest.mark.parametrize("name", ["pixel_mnist", "pixel_cifar10"])
def test_image_splits_read_the_data_sets_own_test_split_and_carve_validation_from_train(
    monkeypatch, name
):
    """Test examples are TFDS's test split; train and validation partition its train split."""
    task = tasks.get_task(name)
    shape = (28, 28, 1) if name == "pixel_mnist" else (32, 32, 3)
    asked = []

    def load(dataset, split, data_dir):
        asked.append((dataset, split, data_dir))
        count = 40 if split == "train" else 10
        ids = np.arange(count) + (1000 if split == "test" else 0)
        images = np.broadcast_to(ids[:, None, None, None] % 256, (count, *shape))
        return images.astype("uint8"), ids.astype("int32")

    monkeypatch.setattr(tasks, "_load_images", load)
    _, test = task.examples("test", "d", validation_fraction=0.25)
    assert asked == [(task.dataset, "test", "d")] and test.tolist() == list(range(1000, 1010))
    _, train = task.examples("train", "d", validation_fraction=0.25)
    _, validation = task.examples("validation", "d", validation_fraction=0.25)
    assert asked[1:] == [(task.dataset, "train", "d")] * 2
    assert len(train) == 30 and len(validation) == 10  # a quarter of the 40, rounded
    assert sorted(train.tolist() + validation.tolist()) == list(range(40))
    _, everything = task.examples("train", "d")
    assert everything.tolist() == list(range(40))  # no validation fraction: all of train


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"name": "mnist_pixels"}, "task"),
        ({"name": "pixel_mnist", "dataset": "kmnist"}, "dataset"),
        ({"name": "pixel_cifar10", "dataset": "fashion_mnist"}, "dataset"),
        ({"name": "pixel_mnist", "timesteps": 100}, "timesteps"),
        ({"name": "noise_padded_cifar10", "timesteps": 10}, "timesteps"),
        ({"name": "adding", "timesteps": 0}, "timesteps"),
    ],
)
def test_invalid_task_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=f"argument `{argument}`"):
        tasks.get_task(**kwargs)


def test_every_task_s_spec_is_named_after_it():
    """The name a model (`{model}_{spec.name}`) and a saved file are called by."""
    for name in tasks.TASK_NAMES:
        assert tasks.get_task(name).spec.name == name


def test_an_image_task_records_whether_a_step_is_a_row_or_a_pixel():
    rows = {name: tasks.get_task(name).per_row for name in tasks.TASK_NAMES[1:6]}
    assert rows == {"pixel_mnist": False, "permuted_mnist": False, "noise_padded_mnist": True,
                    "pixel_cifar10": False, "noise_padded_cifar10": True}  # fmt: skip


def test_a_training_dataset_starts_at_step_zero_with_one_replica():
    task = tasks.get_task("adding", timesteps=20)  # targets of shape (batch, 1)
    inputs, targets = task.examples("train")
    batches = tasks.TrainingBatches(task, inputs, targets, 8, seed=1)
    for (x, y), step in zip(training_dataset(batches).take(2), range(2), strict=True):
        want_x, want_y = batches(step)
        assert x.shape == want_x.shape and y.shape == want_y.shape
        np.testing.assert_array_equal(x.numpy(), want_x)
        np.testing.assert_array_equal(y.numpy(), want_y)


@pytest.mark.parametrize(
    "name, timesteps, expected",
    [("digits", 63, "an integer >= 64"), ("adding", 1, "an integer >= 2"),
     ("copy", 20, "an integer >= 21 (10 symbols, delimiter, 10 outputs)")],
)  # fmt: skip
def test_a_sequence_too_short_for_its_task_is_refused_naming_the_length(name, timesteps, expected):
    with pytest.raises(ValueError) as refused:
        tasks.get_task(name, timesteps=timesteps)
    assert str(refused.value) == (
        f"Received an invalid value for argument `timesteps`, expected {expected}, got {timesteps}."
    )


def test_mnist_validation_split_is_disjoint_from_the_training_and_test_digits(tmp_path):
    """Each digit of an `.npz` MNIST carries its own number in its pixels: the validation
    split (fixed, as the Table 1 rows cut it) shares none with the digits a run trains on,
    together they are the training set, and the test split is read from its own arrays."""

    def numbered(count, offset):
        index = np.arange(offset, offset + count)
        images = np.zeros((count, 28, 28), "uint8")
        images[:, 0, 0], images[:, 0, 1] = index % 256, index // 256
        return images, (index % 10).astype("uint8")

    x_train, y_train = numbered(600, 0)
    x_test, y_test = numbered(100, 600)
    np.savez(tmp_path / "mnist.npz", x_train=x_train, y_train=y_train, x_test=x_test,
             y_test=y_test)  # fmt: skip

    def ids(split):
        inputs, targets = tasks.get_task("permuted_mnist").examples(
            split, data_dir=str(tmp_path), validation_fraction=0.1
        )
        pixels = inputs.reshape(len(inputs), -1)
        found = pixels[:, 0].astype(int) + 256 * pixels[:, 1].astype(int)
        np.testing.assert_array_equal(targets, found % 10)  # each label stays with its digit
        return set(found.tolist())

    train, validation, test = ids("train"), ids("validation"), ids("test")
    assert len(validation) == 60 and len(train) == 540
    assert train.isdisjoint(validation) and train | validation == set(range(600))
    assert test == set(range(600, 700))
    assert ids("validation") == validation  # the same split at every run and seed
