"""Benchmarks of the AntisymmetricRNN layers against Keras' recurrent layers (not in the wheel)."""
