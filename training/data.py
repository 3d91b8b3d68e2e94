"""Get the data sets: download them with TFDS, or export them for machines without TensorFlow.

    python -m training.data prepare --dataset fashion_mnist --data-dir data/tfds

downloads and prepares a TFDS data set (needs the internet; `training.train
--download` does the same on the fly). A machine without the internet takes
a prepared folder copied from one that has it.

    python -m training.data export --dataset fashion_mnist \\
        --data-dir data/tfds --out data/

writes `data/fashion_mnist.npz` in `keras.datasets`' layout (`x_train`,
`y_train`, `x_test`, `y_test`; uint8 images, int32 labels). Training on any
backend then takes `--data-dir data/` and needs neither TensorFlow nor TFDS.
"""

from __future__ import annotations

import os

import numpy as np

from apputil import cli
from apputil.errors import invalid
from apputil.files import atomic_path
from training.errors import EXPECTED
from training.tasks import catalog as tasks

EXPORTABLE = (*tasks.MNIST_DATASETS, "cifar10")


def export(dataset: str, data_dir: str | None, out: str) -> str:
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


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = cli.OneLineParser(prog="python -m training.data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("prepare", help="download and prepare a TFDS data set")
    command.add_argument("--dataset", required=True, choices=EXPORTABLE)
    command.add_argument("--data-dir", default=None, help="TFDS data directory (or TFDS_DATA_DIR)")
    command = commands.add_parser("export", help="TFDS data set -> DATASET.npz")
    command.add_argument("--dataset", required=True, choices=EXPORTABLE)
    command.add_argument("--data-dir", default=None, help="TFDS data directory (or TFDS_DATA_DIR)")
    command.add_argument("--out", required=True, help="folder for DATASET.npz")
    args = parser.parse_args(argv)

    def body():
        if args.command == "prepare":
            print(f"prepared {args.dataset} in {tasks.prepare(args.dataset, args.data_dir)}")
        else:
            print(f"wrote {export(args.dataset, args.data_dir, args.out)}")

    return cli.run(parser.prog, body, EXPECTED)


if __name__ == "__main__":
    cli.execute(main)
