"""The paper's sequence tasks as deterministic, step-indexed NumPy batches.

Every training batch is a pure function of `(seed, global step)`: batch `s`
takes positions `[o·B, (o+1)·B)` of the permutation of epoch `e`, with
`(e, o) = divmod(s, steps_per_epoch)`, and draws its noise from the generator
seeded with `(seed, s)`. A resumed run therefore sees exactly the batches it
would have seen, and a distributed run sees exactly the global batches of a
single-device run, split row-wise over the replicas. The batches are NumPy on
every backend (TensorFlow wraps them in `tf.data`), so no task needs TensorFlow.
"""

import dataclasses
import logging
import os
import zipfile

import numpy as np

from apputil.errors import invalid
from training.errors import DataError

MNIST_DATASETS = ("mnist", "fashion_mnist")
PERMUTATION_SEED = 92916  # the fixed permutation of permuted_mnist; recorded in the config
VALIDATION_SEED = 1234  # which training examples form the validation split
SYNTHETIC_TEST_EXAMPLES = 2048
SYNTHETIC_VALIDATION_EXAMPLES = 1024


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Shapes and head of a task.

    Attributes:
        name: The task's name.
        timesteps: Sequence length `T`.
        features: Input size per step `m`.
        num_outputs: Classes of the head (1 for regression).
        head: The name of its head (`training.tasks.heads.HEADS`): "classification"
            (classify the last state), "per_step_classification" (classify every
            step) or "regression" (regress from the last state).
        params: Parameters that define the task (recorded in the run's config).
        scored_steps: For per-step heads, the trailing steps that count
            towards accuracy (the copy task scores its 10 recall steps).
        tolerance: For "regression" heads, the absolute error under which a
            prediction counts as correct.
    """

    name: str
    timesteps: int
    features: int
    num_outputs: int
    head: str
    params: dict
    scored_steps: int = 0
    tolerance: float = 0.0


def npz_path(data_dir, name):
    """Where `python -m training.data export` keeps data set `name` in `data_dir`."""
    return os.path.join(data_dir, f"{name}.npz")


def _load_images(name, split, data_dir):
    """All examples of a split ("train"/"test") as uint8 images and int32 labels.

    `data_dir` (or TFDS_DATA_DIR) is a TFDS data directory or a folder of
    `NAME.npz` files in `keras.datasets`' layout (`x_train`, `y_train`,
    `x_test`, `y_test`), as `python -m training.data export` writes them; the
    `.npz` needs neither TensorFlow nor TFDS.
    """
    data_dir = data_dir or os.environ.get("TFDS_DATA_DIR")
    if data_dir is not None and not os.path.isdir(data_dir):
        expected = "an existing TFDS data directory or a folder of .npz files"
        raise invalid("--data-dir", expected, data_dir, DataError)
    if data_dir is not None and os.path.isfile(npz_path(data_dir, name)):
        path = npz_path(data_dir, name)
        try:
            with np.load(path, allow_pickle=False) as arrays:
                images, labels = arrays[f"x_{split}"], arrays[f"y_{split}"]
        except KeyError:
            raise DataError(
                f"{path} has no array 'x_{split}' and 'y_{split}' (keras.datasets' layout: "
                f"x_train, y_train, x_test, y_test)"
            ) from None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
            raise DataError(f"{path} is not a readable .npz file ({error})") from None
        return _checked_images(name, split, images, labels, path)
    try:
        images, labels = _load_tfds(name, split, data_dir)
    except DataError:
        raise
    except Exception as error:  # a damaged TFDS folder fails in many ways, none of them a bug here
        where = data_dir or "~/tensorflow_datasets"
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DataError(f"TFDS data set {name!r} in {where} cannot be read: {reason}") from None
    return _checked_images(name, split, images, labels, f"TFDS {name!r}")


# (height, width, channels) of each image data set.
IMAGE_SHAPES = {"mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3)}


def _checked_images(name, split, images, labels, source):
    """`(images uint8, labels int32)`, or `DataError` if they are not the data set's."""
    shape = IMAGE_SHAPES.get(name)
    images, labels = np.asarray(images), np.asarray(labels)
    if shape is not None and images.shape[1:] not in (shape, shape[:2] if shape[2] == 1 else shape):
        raise DataError(
            f"{source}: the {split} images have shape {images.shape}, expected (N, "
            f"{', '.join(map(str, shape))}) for {name}"
        )
    if labels.shape != images.shape[:1]:
        raise DataError(
            f"{source}: {labels.shape} {split} labels for {len(images)} images, expected "
            f"({len(images)},)"
        )
    numeric = np.issubdtype(images.dtype, np.number) and np.issubdtype(labels.dtype, np.integer)
    if not numeric or (labels.size and (labels.min() < 0 or labels.max() >= 10)):
        raise DataError(
            f"{source}: expected numeric images and integer labels 0-9, got {images.dtype} "
            f"images and {labels.dtype} labels"
        )
    return images.astype("uint8"), labels.astype("int32")


def _import_tfds(name):
    try:
        import tensorflow_datasets as tfds  # imports TensorFlow: only for TFDS data sets
    except ImportError:
        raise DataError(
            f"data set {name!r} needs tensorflow-datasets or an exported "
            f"{name}.npz in --data-dir (python -m training.data export)"
        ) from None
    return tfds


def prepare(name, data_dir=None):
    """Downloads and prepares TFDS data set `name` in `data_dir` (needs the internet).

    Does nothing when it is prepared already. Returns the folder it is in.
    """
    tfds = _import_tfds(name)
    data_dir = data_dir or os.environ.get("TFDS_DATA_DIR")
    builder = tfds.builder(name, data_dir=data_dir)
    try:
        builder.download_and_prepare()
    except (OSError, tfds.download.DownloadError) as error:
        raise DataError(
            f"cannot download TFDS data set {name!r} into {builder.data_dir_root}: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__} "
            f"(without the internet, prepare it on a machine that has it with "
            f"`python -m training.data prepare --dataset {name} --data-dir DIR` and copy DIR)"
        ) from None
    return builder.data_dir


def _load_tfds(name, split, data_dir):
    """All examples of a TFDS split as uint8 images and int32 labels."""
    tfds = _import_tfds(name)
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # TFDS warns about what the DataError below says
    try:
        ds = tfds.load(name, split=split, as_supervised=True, data_dir=data_dir, download=False)
    except (AssertionError, tfds.core.registered.DatasetNotFoundError, OSError) as error:
        raise DataError(
            f"TFDS data set {name!r} ({split}) is not prepared in "
            f"{data_dir or '~/tensorflow_datasets'}: pass --data-dir (or set TFDS_DATA_DIR) "
            f"to a folder holding it, or fetch it with --download (needs the internet; or "
            f"`python -m training.data prepare --dataset {name}`). "
            f"({str(error).splitlines()[0]})"
        ) from None
    finally:
        absl.setLevel(level)
    images, labels = [], []
    for x, y in tfds.as_numpy(ds.batch(8192)):
        images.append(x)
        labels.append(y)
    return np.concatenate(images).astype("uint8"), np.concatenate(labels).astype("int32")


def batch_generator(seed):
    """A NumPy generator that is a pure function of `seed`, a sequence of integers."""
    return np.random.default_rng([int(value) % (1 << 63) for value in np.ravel(seed)])


def _pad_with_noise(x, timesteps, seed):
    """Appends N(0, 1) noise drawn from `seed` to `(B, steps, m)` up to `timesteps`."""
    padding = timesteps - x.shape[1]
    if not padding:
        return x
    noise = batch_generator(seed).standard_normal((len(x), padding, x.shape[2]), "float32")
    return np.concatenate([x, noise], axis=1)


def _split_validation(images, labels, split, validation_fraction):
    """Carves a fixed validation subset out of the training examples."""
    if not validation_fraction:
        if split == "validation":
            raise invalid("validation_fraction", "a float in (0, 1) for a validation split", 0)
        return images, labels
    order = np.random.RandomState(VALIDATION_SEED).permutation(len(labels))
    count = max(1, int(round(validation_fraction * len(labels))))
    chosen = order[:count] if split == "validation" else order[count:]
    chosen = np.sort(chosen)
    return images[chosen], labels[chosen]


class Task:
    """A task: its examples per split and the batch transform to sequences."""

    spec: TaskSpec
    dataset: str | None = None  # the TFDS data set it reads, if any

    def examples(self, split, data_dir=None, validation_fraction=0.0):
        """`(inputs, targets)` NumPy arrays of a split ("train", "validation", "test")."""
        raise NotImplementedError

    def make_batch(self, inputs, targets, seed):
        """Turns a batch of raw examples into `(x (B, T, m) float32, y)`.

        `seed` is a sequence of integers (`(seed, stream, step)`) that
        seeds any noise (`batch_generator`): the batch is a pure function of it.
        """
        raise NotImplementedError


class ImageSequenceTask(Task):
    """Images (TFDS) read as sequences: pixel by pixel or row by row."""

    def __init__(self, name, dataset, per_row, permute=False, timesteps=None):
        self.dataset = dataset
        height, width, channels = (32, 32, 3) if dataset == "cifar10" else (28, 28, 1)
        self.shape = (height, width, channels)
        self.per_row = per_row
        if per_row:
            steps, features = height, width * channels
        else:
            steps, features = height * width, channels
        total = timesteps or steps
        if total < steps:
            raise invalid("timesteps", f"an integer >= {steps} (the image's own steps)", total)
        self.image_steps = steps
        self.permutation = (
            np.random.RandomState(PERMUTATION_SEED).permutation(steps) if permute else None
        )
        params = {"dataset": dataset, "timesteps": total}
        if permute:
            params["permutation_seed"] = PERMUTATION_SEED
        self.spec = TaskSpec(name, total, features, 10, "classification", params)

    def examples(self, split, data_dir=None, validation_fraction=0.0):
        source = "test" if split == "test" else "train"
        images, labels = _load_images(self.dataset, source, data_dir)
        if split != "test":
            images, labels = _split_validation(images, labels, split, validation_fraction)
        return images, labels

    def make_batch(self, inputs, targets, seed):
        x = np.asarray(inputs, "float32") / np.float32(255.0)
        x = x.reshape(-1, self.image_steps, self.spec.features)
        if self.permutation is not None:
            x = x[:, self.permutation]
        return _pad_with_noise(x, self.spec.timesteps, seed), np.asarray(targets)


class DigitsTask(Task):
    """scikit-learn's bundled 8×8 digits (1,797 real images), pixel by pixel.

    Pixels are scaled to [0, 1] (the data's range is 0-16). The test split is
    a fixed 20% of the images; `timesteps > 64` pads with Gaussian noise.
    """

    TEST_FRACTION = 0.2

    def __init__(self, timesteps=None):
        total = timesteps or 64
        if total < 64:
            raise invalid("timesteps", "an integer >= 64", total)
        self.spec = TaskSpec("digits", total, 1, 10, "classification", {"timesteps": total})

    def examples(self, split, data_dir=None, validation_fraction=0.0):
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.round(digits.images).astype("uint8")  # 0..16
        labels = digits.target.astype("int32")
        order = np.random.RandomState(0).permutation(len(labels))
        cut = int(len(labels) * self.TEST_FRACTION)
        chosen = order[:cut] if split == "test" else order[cut:]
        images, labels = images[np.sort(chosen)], labels[np.sort(chosen)]
        if split != "test":
            images, labels = _split_validation(images, labels, split, validation_fraction)
        return images, labels

    def make_batch(self, inputs, targets, seed):
        x = (np.asarray(inputs, "float32") / np.float32(16.0)).reshape(-1, 64, 1)
        return _pad_with_noise(x, self.spec.timesteps, seed), np.asarray(targets)


class SyntheticTask(Task):
    """Generated tasks: every batch is drawn from its stateless seed.

    The train split is an endless stream; the validation and test splits are
    fixed sets of example ids drawn with their own seeds.
    """

    TRAIN_EXAMPLES = 1 << 20  # ids of the stream (only sets the epoch length)

    def examples(self, split, data_dir=None, validation_fraction=0.0):
        count = {
            "train": self.TRAIN_EXAMPLES,
            "validation": SYNTHETIC_VALIDATION_EXAMPLES,
            "test": SYNTHETIC_TEST_EXAMPLES,
        }[split]
        offset = {"train": 0, "validation": 1 << 40, "test": 1 << 41}[split]
        ids = np.arange(offset, offset + count, dtype="int64")
        return ids, ids

    @staticmethod
    def generator(inputs, seed):
        """The generator of a batch of example ids `inputs`: drawn from `seed` and the
        batch's first id. Evaluation seeds are the same for every split; the ids are not,
        so the validation and test sequences differ (model selection never sees test data).
        """
        first = int(np.ravel(inputs)[0]) if len(inputs) else 0
        return batch_generator((*np.ravel(seed), first))


class AddingTask(SyntheticTask):
    """The adding problem (Hochreiter & Schmidhuber 1997; Le et al. 2015).

    Input `(T, 2)`: uniform values in [0, 1] and a marker channel with two
    ones, one in each half; the target is the sum of the two marked values.
    Accuracy counts predictions within 0.04 of the target.
    """

    TOLERANCE = 0.04

    def __init__(self, timesteps=None):
        total = timesteps or 200
        if total < 2:
            raise invalid("timesteps", "an integer >= 2", total)
        self.spec = TaskSpec(
            "adding", total, 2, 1, "regression", {"timesteps": total}, tolerance=self.TOLERANCE
        )

    def make_batch(self, inputs, targets, seed):
        batch, steps = len(inputs), self.spec.timesteps
        rng = self.generator(inputs, seed)
        values = rng.random((batch, steps), dtype="float32")
        half = steps // 2
        first = rng.integers(0, half, batch)
        second = rng.integers(half, steps, batch)
        markers = np.zeros((batch, steps), "float32")
        markers[np.arange(batch), first] = 1.0
        markers[np.arange(batch), second] = 1.0
        x = np.stack([values, markers], axis=-1)
        y = np.sum(values * markers, axis=1, keepdims=True)
        return x, y


class CopyTask(SyntheticTask):
    """The copy memory problem (Hochreiter & Schmidhuber 1997; Arjovsky et al. 2016).

    Ten symbols from {1..8}, `delay` blanks (0), a delimiter (9), then ten
    blanks during which the model must output the ten symbols; targets are
    blank (0) elsewhere. Total length `T = delay + 20`, one-hot inputs (m=10),
    a 10-way classification at every step.
    """

    SYMBOLS = 10

    def __init__(self, timesteps=None):
        total = timesteps or 120
        if total < 21:
            raise invalid(
                "timesteps", "an integer >= 21 (10 symbols, delimiter, 10 outputs)", total
            )
        self.spec = TaskSpec(
            "copy", total, 10, 10, "per_step_classification", {"timesteps": total},
            scored_steps=10,
        )

    def make_batch(self, inputs, targets, seed):
        batch, steps = len(inputs), self.spec.timesteps
        symbols = self.generator(inputs, seed).integers(1, 9, (batch, 10), dtype="int32")
        sequence = np.zeros((batch, steps), "int32")
        sequence[:, :10] = symbols
        sequence[:, steps - 11] = 9
        target = np.zeros((batch, steps), "int32")
        target[:, steps - 10 :] = symbols
        return np.eye(self.SYMBOLS, dtype="float32")[sequence], target


TASK_NAMES = (
    "digits",
    "pixel_mnist",
    "permuted_mnist",
    "noise_padded_mnist",
    "pixel_cifar10",
    "noise_padded_cifar10",
    "adding",
    "copy",
)


def get_task(name, timesteps=None, dataset=None):
    """The task called `name`.

    Args:
        name: One of `TASK_NAMES`.
        timesteps: Sequence length for the tasks that take one (noise padded,
            digits, adding, copy); `None` for the task's default (the paper's
            T=1000 for noise_padded_cifar10).
        dataset: For the MNIST tasks, "mnist" (default) or "fashion_mnist".
    """
    mnist_tasks = ("pixel_mnist", "permuted_mnist", "noise_padded_mnist")
    if name not in TASK_NAMES:
        raise invalid("task", f"one of {', '.join(TASK_NAMES)}", name)
    if dataset is not None and name not in mnist_tasks:
        raise invalid(
            "dataset", f"no dataset for task {name} (only the MNIST tasks take one)", dataset
        )
    if name in mnist_tasks:
        dataset = dataset or "mnist"
        if dataset not in MNIST_DATASETS:
            raise invalid("dataset", f"one of {', '.join(MNIST_DATASETS)}", dataset)
    fixed_length = ("pixel_mnist", "permuted_mnist", "pixel_cifar10")
    if timesteps is not None and name in fixed_length:
        raise invalid("timesteps", f"no value for the fixed-length task {name}", timesteps)
    if timesteps is not None and (
        isinstance(timesteps, bool) or int(timesteps) != timesteps or timesteps <= 0
    ):
        raise invalid("timesteps", "a positive integer", timesteps)
    if name == "digits":
        return DigitsTask(timesteps)
    if name == "pixel_mnist":
        return ImageSequenceTask(name, dataset, per_row=False)
    if name == "permuted_mnist":
        return ImageSequenceTask(name, dataset, per_row=False, permute=True)
    if name == "noise_padded_mnist":
        return ImageSequenceTask(name, dataset, per_row=True, timesteps=timesteps or 1000)
    if name == "pixel_cifar10":
        return ImageSequenceTask(name, "cifar10", per_row=False)
    if name == "noise_padded_cifar10":
        return ImageSequenceTask(name, "cifar10", per_row=True, timesteps=timesteps or 1000)
    if name == "adding":
        return AddingTask(timesteps)
    return CopyTask(timesteps)


class TrainingBatches:
    """Training batch `s` as a pure function of `(seed, s)` (see the module doc).

    Args:
        task: A `Task`.
        inputs, targets: The training examples (from `task.examples`).
        batch_size: The global batch size `B`.
        seed: Integer seed of the shuffling and noise.
    """

    def __init__(self, task, inputs, targets, batch_size, seed):
        count = len(targets)
        self.steps_per_epoch = count // batch_size
        if self.steps_per_epoch == 0:
            raise invalid("batch_size", f"at most the {count} training examples", batch_size)
        self.task, self.inputs, self.targets = task, inputs, targets
        self.batch_size, self.seed = batch_size, seed
        self._epoch, self._order = None, None

    def order(self, epoch):
        """The permutation of the examples in epoch `epoch`."""
        if epoch != self._epoch:  # one epoch's order is reused by its steps
            rng = batch_generator((self.seed, 0, epoch))
            self._epoch, self._order = epoch, rng.permutation(len(self.targets))
        return self._order

    def __call__(self, step):
        epoch, offset = divmod(int(step), self.steps_per_epoch)
        index = self.order(epoch)[offset * self.batch_size : (offset + 1) * self.batch_size]
        return self.task.make_batch(self.inputs[index], self.targets[index], (self.seed, 1, step))


def evaluation_batches(task, inputs, targets, batch_size, seed):
    """Every example of an evaluation split once, in order, as `(x, y)` batches."""
    for number, start in enumerate(range(0, len(targets), batch_size)):
        end = start + batch_size
        yield task.make_batch(inputs[start:end], targets[start:end], (seed, 2, number))
