"""Serving path for keras-antisym models: SavedModel export, REST client, local server.

Production uses the TensorFlow Serving container (`serving/Dockerfile`); the
local server (`python -m serving.server`) answers the same REST subset for
laptops, demos and tests.
"""
