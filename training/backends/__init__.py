"""What a run trains on: how a command's processes and devices are set up
(`launch_config`), the backend made from that once (`select`, `backend`), with the
strategy or distribution of each Keras backend (`strategies`, `distributions`, the JAX
processes' `cluster`), and the trainers that drive a model there (`trainer_tf`,
`trainer_keras`)."""
