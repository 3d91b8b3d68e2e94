"""Serving path for keras-antisym models: SavedModel export, REST and gRPC clients, local server.

Production uses the TensorFlow Serving container (`serving/Dockerfile`); the
local server (`python -m serving.server`) answers the same REST and gRPC APIs
for laptops, demos and tests, one model or those of a model config file.
Importing this package, or its REST routing, HTTP server and client modules,
imports no TensorFlow: only loading or exporting a model, or the gRPC path
(TensorFlow Serving's protos), does.
"""
