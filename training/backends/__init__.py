"""What a run trains on: the strategy or distribution of each Keras backend
(`distribution`) and the trainers that drive a model there (`trainers`, `trainer_tf`,
`trainer_keras`)."""
