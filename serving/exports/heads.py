"""Which head a model to export has: recorded in its output layer's name
(`training.tasks.heads.Head.layer_name`, as training builds it), given, or inferred
from the one layout older exports served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apputil.errors import Literal, invalid
from training.tasks.heads import HEADS

if TYPE_CHECKING:
    import keras


#: The heads' names, in the order the CLI lists them.
HEAD_NAMES = tuple(HEADS)


def _output_layer(model: keras.Model) -> keras.Layer | None:
    outputs = getattr(model, "outputs", None) or []
    history = getattr(outputs[0], "_keras_history", None) if len(outputs) == 1 else None
    if history is not None:
        return history[0]
    return model.layers[-1] if getattr(model, "layers", None) else None


def recorded_head(model: keras.Model) -> str | None:
    """The head recorded in `model` (its output layer's name `<head>_head`), or None."""
    name = getattr(_output_layer(model), "name", None)
    return next((head.name for head in HEADS.values() if name == head.layer_name), None)


def resolve_head(model: keras.Model, head: str | None = None) -> tuple[str, str]:
    """`(head, how)`: the head to export `model` with, and where it came from.

    `head` (one of `HEAD_NAMES`) overrides the recorded one. A model that records no
    head is exported as a classifier only when its output is `(batch, classes)`
    with classes >= 2, the one layout older exports served; anything else is refused.

    Raises:
        apputil.errors.UsageError: naming the expected heads, when no head fits the model.
    """
    shape = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else None
    if head is not None and head not in HEADS:
        raise invalid("head", f"one of {', '.join(HEAD_NAMES)}", head)
    how = "given"
    if head is None:
        head, how = recorded_head(model), "recorded"
    if head is None:
        layer = getattr(_output_layer(model), "name", None)
        if shape is None or len(shape) != 2 or not shape[1] or shape[1] < 2:
            raise invalid(
                "model",
                "a model whose output layer is named for its head ("
                + ", ".join(h.layer_name for h in HEADS.values())
                + ") as training.tasks.models builds it, or --head "
                + "|".join(HEAD_NAMES),
                Literal(f"output layer {layer!r} with output shape {shape}"),
            )
        head, how = "classification", f"inferred from output layer {layer!r} of shape {shape}"
    kind = HEADS[head]
    if shape is None or len(shape) != kind.rank or (shape[-1] or 0) < kind.min_units:
        raise invalid(
            "head",
            f"a model with {kind.layout} outputs for head {head!r} ({how})",
            Literal(f"output shape {shape}"),
        )
    return head, how
