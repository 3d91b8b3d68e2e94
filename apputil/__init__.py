"""Standard-library helpers shared by `training/`, `serving/` and `benchmarks/` (not in the wheel).

`errors` (the one wording of a bad argument, usage errors as a class), `files`
(atomic, durable writes), `cli` (one-line argument errors, a command's error
boundary), `net` (loopback addresses), `processes` (this host's processes),
`signals` (signals as exceptions) and `quiet` (TensorFlow and Keras imported
without native start-up noise). Importing this package or any of its modules imports nothing heavy.
"""
