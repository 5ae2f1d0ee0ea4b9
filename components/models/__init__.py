"""Trained models after training: the evaluate step, the archive step (versioned model store), prediction, and
portable formats (``onnx``: ONNX export, onnxruntime prediction).

May import: ``heteroflow.components.core``, ``devices``, ``data``, ``training``, ``errors``, ``heteroflow.cache``.
"""
