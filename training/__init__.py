"""Training, tuning and paper experiments for keras-antisym (not shipped in the wheel)."""
