"""One training run: `experiment.train_and_evaluate(config, workdir)` assembles it; `loop`
drives its steps; `schedules` and `summaries` are the learning rate and the TensorBoard
scalars it uses."""
