"""Model -> artifact: everything on the training side of the handoff."""

from keras_vllm.export.exporter import export_vllm  # noqa: F401
