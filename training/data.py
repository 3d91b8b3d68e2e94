"""Prepare data sets once where TFDS works, for machines without TensorFlow.

    python -m training.data export --dataset fashion_mnist \\
        --data-dir ../shared/data/tfds --out data/

writes `data/fashion_mnist.npz` in `keras.datasets`' layout (`x_train`,
`y_train`, `x_test`, `y_test`; uint8 images, int32 labels). Training on any
backend then takes `--data-dir data/` and needs neither TensorFlow nor TFDS.
"""

import argparse
import os
import sys

import numpy as np

from training import tasks
from training.config import invalid
from training.files import atomic_path

EXPORTABLE = (*tasks.MNIST_DATASETS, "cifar10")


def export(dataset, data_dir, out):
    """Writes `out/DATASET.npz` from the TFDS data in `data_dir`; returns its path."""
    if dataset not in EXPORTABLE:
        raise invalid("--dataset", f"one of {', '.join(EXPORTABLE)}", dataset)
    arrays = {}
    for split in ("train", "test"):
        arrays[f"x_{split}"], arrays[f"y_{split}"] = tasks._load_images(dataset, split, data_dir)
    os.makedirs(out, exist_ok=True)
    path = tasks.npz_path(out, dataset)
    with atomic_path(path) as partial, open(partial, "wb") as handle:
        np.savez_compressed(handle, **arrays)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m training.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("export", help="TFDS data set -> DATASET.npz")
    command.add_argument("--dataset", required=True, choices=EXPORTABLE)
    command.add_argument("--data-dir", default=None, help="TFDS data directory (or TFDS_DATA_DIR)")
    command.add_argument("--out", required=True, help="folder for DATASET.npz")
    args = parser.parse_args(argv)
    try:
        path = export(args.dataset, args.data_dir, args.out)
    except ValueError as error:  # includes tasks.DataError
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
