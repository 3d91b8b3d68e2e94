"""Small helpers shared by test modules of different parts."""

import subprocess
import sys

import keras


class TrainingByDefault(keras.layers.Layer):
    """Doubles its input in training mode, which its `call` takes by default: Keras gives
    a layer its own default when no `training` reaches it, so only an explicit
    `training=False` from the caller keeps it in inference mode."""

    def call(self, x, training=True):
        return 2.0 * x if training else x


def ended_pid():
    """The pid of a child process that has ended and been reaped: no process has it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def record_figures(monkeypatch, module):
    """The matplotlib figures `module` makes (through its `Figure`), kept in a list."""
    from matplotlib.figure import Figure

    made = []

    class Recorded(Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(module, "Figure", Recorded)
    return made
