"""Training, tuning and paper experiments for keras-antisym (in the repository, not the wheel).

Importing this package or its light modules (`training.config`,
`training.options`, `training.tasks.catalog`) loads neither Keras nor TensorFlow; the
commands import them after parsing their flags.
"""
