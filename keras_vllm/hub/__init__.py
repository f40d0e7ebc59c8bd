"""What export and load both know about KerasHub models.

- `classes`: the model and layer classes keras-vllm can rebuild, by name.
- `presets`: preset handles, local preset directories, pins.
- `weights`: a backbone's variables to and from orbax-checkpoint trees.
- `reference`: the Keras forward pass and `generate()` as the reference.
- `imports`: keras-hub without TensorFlow in serving processes, and no
  vLLM in commands that never serve.

No module here imports vLLM; `export/`, `load/` and `serve/` build on it.
"""
