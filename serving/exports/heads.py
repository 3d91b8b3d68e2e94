"""The heads an export serves: what each one's outputs look like, and which one a model
has (recorded in its output layer's name, `<head>_head`, as `training.tasks.models`
names it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from apputil.errors import Literal, invalid

if TYPE_CHECKING:
    import keras


@dataclass(frozen=True)
class HeadKind:
    """A head's output layout: its rank and the least units of its last axis."""

    name: str
    rank: int
    min_units: int
    layout: str


#: The heads, by name, in the order the CLI lists them.
KINDS = {
    kind.name: kind
    for kind in (
        HeadKind("classification", 2, 2, "(batch, classes >= 2)"),
        HeadKind("regression", 2, 0, "(batch, k)"),
        HeadKind("per_step_classification", 3, 2, "(batch, T, classes >= 2)"),
    )
}
HEADS = tuple(KINDS)


def _output_layer(model: keras.Model) -> keras.Layer | None:
    outputs = getattr(model, "outputs", None) or []
    history = getattr(outputs[0], "_keras_history", None) if len(outputs) == 1 else None
    if history is not None:
        return history[0]
    return model.layers[-1] if getattr(model, "layers", None) else None


def recorded_head(model: keras.Model) -> str | None:
    """The head recorded in `model` (its output layer's name `<head>_head`), or None."""
    name = getattr(_output_layer(model), "name", None)
    return next((head for head in HEADS if name == f"{head}_head"), None)


def resolve_head(model: keras.Model, head: str | None = None) -> tuple[str, str]:
    """`(head, how)`: the head to export `model` with, and where it came from.

    `head` (one of `HEADS`) overrides the recorded one. A model that records no
    head is exported as a classifier only when its output is `(batch, classes)`
    with classes >= 2, the one layout older exports served; anything else is refused.

    Raises:
        apputil.errors.UsageError: naming the expected heads, when no head fits the model.
    """
    shape = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else None
    if head is not None and head not in HEADS:
        raise invalid("head", f"one of {', '.join(HEADS)}", head)
    how = "given"
    if head is None:
        head, how = recorded_head(model), "recorded"
    if head is None:
        layer = getattr(_output_layer(model), "name", None)
        if shape is None or len(shape) != 2 or not shape[1] or shape[1] < 2:
            raise invalid(
                "model",
                "a model whose output layer is named for its head ("
                + ", ".join(f"{h}_head" for h in HEADS)
                + ") as training.tasks.models builds it, or --head "
                + "|".join(HEADS),
                Literal(f"output layer {layer!r} with output shape {shape}"),
            )
        head, how = "classification", f"inferred from output layer {layer!r} of shape {shape}"
    kind = KINDS[head]
    if shape is None or len(shape) != kind.rank or (shape[-1] or 0) < kind.min_units:
        raise invalid(
            "head",
            f"a model with {kind.layout} outputs for head {head!r} ({how})",
            Literal(f"output shape {shape}"),
        )
    return head, how
