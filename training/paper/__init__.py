"""The paper's experiments: the reproduction suite (`suite`, with the run configs in
`configs/`) and the report of its results (`report`)."""
