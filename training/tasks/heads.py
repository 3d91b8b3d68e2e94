"""The heads a model can have: what its outputs mean, for training and serving alike.

A task names its head (`training.tasks.catalog.TaskSpec.head`); the model's output
layer is named for it (`Head.layer_name`), so a saved `.keras` file records what
its outputs mean wherever it is copied, and the exporter (`serving.exports.heads`)
reads it back to choose the serving outputs. The losses (`objectives`), the model's
recurrent layer (`models`) and the served outputs (`serving.exports.signatures`)
branch on a head's properties, not on its name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Head:
    """One head.

    Attributes:
        name: Its name, in task specs, the exporter's `--head` and the output layer's name.
        per_step: An output at every step (the recurrent layer returns its sequence),
            else one from the last state.
        regression: Values (mean squared error), else class logits (cross-entropy).
        min_units: The least units of the output's last axis (2 classes).
        layout: The output's shape, in words.
    """

    name: str
    per_step: bool
    regression: bool
    min_units: int
    layout: str

    @property
    def rank(self) -> int:
        """The rank of the model's output: `(batch, units)`, or `(batch, T, units)` per step."""
        return 3 if self.per_step else 2

    @property
    def layer_name(self) -> str:
        """The name of a model's output layer with this head."""
        return f"{self.name}_head"


#: The heads by name, in the order the exporter's command lists them.
HEADS = {
    head.name: head
    for head in (
        Head("classification", False, False, 2, "(batch, classes >= 2)"),
        Head("regression", False, True, 0, "(batch, k)"),
        Head("per_step_classification", True, False, 2, "(batch, T, classes >= 2)"),
    )
}
