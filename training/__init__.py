"""Training, tuning and paper experiments for keras-antisym (in the repository, not the wheel).

The folders are the jobs, each importing only those below it:

* `train`, `tune`, `reproduce`, `launch`, `data`, `figures` (with `options`, their
  flags): the commands. They parse flags into configs, make the backend once, and hand
  both down.
* `paper/`: the reproduction suite and its report; `search/`: keras-tuner over runs.
* `run/`: one run (`experiment`: assembled in one place; `loop.Run` and its
  `callbacks`; the folder's layout `rundir.RunDir`; the resume identity `identity`).
* `backends/`: what a run trains on, one class per Keras backend (`select.start`
  chooses), the trainers, and the JAX processes of a run (`cluster.Cluster`).
* `tasks/`: the data of each task, the models, losses and optimizers.
* `config`, `errors`: the typed configs and the failures, which everything uses.

Importing this package or its light modules (`training.config`, `training.options`,
`training.tasks.catalog`) loads neither Keras nor TensorFlow; the commands import them
after parsing their flags.
"""
