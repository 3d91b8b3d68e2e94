"""The local server wing: TensorFlow Serving's REST and gRPC APIs for exported models.

`server` holds the settings and the `LocalServer`; `repository` loads and
watches version folders (`model_config` names models and labels); `payload`
and `tensors` check requests in JSON and in TensorProtos; `rest` (on `httpd`,
waitress) and `grpcd` are the transports; `metrics` counts what they answer.
It reads what `serving.exports` writes and imports from it, never the other way.
"""
