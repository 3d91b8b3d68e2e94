"""Hyperparameter search with keras-tuner: the search space (`space`), the hypermodel that
trains a trial (`hypermodels`) and the tuner over a project folder (`tuner`)."""
