"""Serving path for keras-antisym models: SavedModel export, REST client, local server.

Production uses the TensorFlow Serving container (`serving/Dockerfile`); the
local server (`python -m serving.server`) answers the same REST subset for
laptops, demos and tests. Importing this package, or its REST routing, HTTP
server and client modules, imports no TensorFlow: only loading or exporting a
model does.
"""
