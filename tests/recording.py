"""A stand-in for the loop's summary writer (`training.run.summaries`) keeping what it gets."""


class RecordingWriter:
    """Records every `scalar(name, value, step)` call, in order."""

    def __init__(self):
        self.scalars = []  # (name, value, step)

    def scalar(self, name, value, step):
        self.scalars.append((name, value, step))

    def flush(self):
        pass

    def series(self, name):
        """`[(step, value)]` of one scalar, in the order written."""
        return [(step, value) for written, value, step in self.scalars if written == name]
