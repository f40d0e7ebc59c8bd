"""What export and load both know about KerasHub models.

- `classes`: the model and layer classes keras-vllm can rebuild, by name.
- `presets`: preset handles, local preset directories, pins.
- `weights`: a backbone's variables keyed by Keras `Variable.path`.
- `checkpoint`: those variables saved to and restored from orbax-checkpoint.
- `weight_headers`: a checkpoint's shapes and dtypes without starting JAX.
- `reference`: the Keras forward pass and `generate()` as the reference.
- `imports`: keras-hub without TensorFlow in serving processes, and no
  vLLM in commands that never serve.

No module here imports vLLM; `export/`, `load/` and `serve/` build on it.
"""
