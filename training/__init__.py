"""Training, tuning and paper experiments for keras-antisym (not shipped in the wheel)."""

import os

# The CLIs start quietly: TensorFlow reads this when it is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
