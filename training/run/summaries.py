"""TensorBoard scalars on every backend, written with the `tensorboard` package alone."""

import os
import time


class ScalarWriter:
    """Writes scalar summaries to event files in `logdir` (None: writes nothing).

    Uses TensorBoard's own event-file writer, so logs need no TensorFlow.
    """

    def __init__(self, logdir=None):
        self._writer = None
        if logdir is not None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            os.makedirs(logdir, exist_ok=True)
            self._writer = EventFileWriter(logdir)

    def scalar(self, name, value, step):
        if self._writer is None:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=name, simple_value=float(value))])
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def flush(self):
        if self._writer is not None:
            self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()
