"""Tasks and what a run builds for them: the data of each task (`catalog`), the models
(`models`), the losses and accuracies (`objectives`) and the optimizers (`optimizers`)."""
