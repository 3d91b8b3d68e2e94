"""The export wing: a trained Keras model as served files.

`export` writes a version folder (SavedModel, LiteRT or ONNX) with the
signatures of `signatures` (the one-step loops of `steploop` and `tfloop`, the
LiteRT and ONNX writers of `litert` and `onnxgraphs`), its warmup requests
(`warmup`) and the head it serves (`heads`), atomically (`versions`);
`runtimes` runs LiteRT and ONNX exports. Nothing here imports the local server
(`serving.local`), which reads these folders.
"""
