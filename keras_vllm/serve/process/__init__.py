"""How vLLM's engine process starts from a process that runs JAX.

- `start`: the engine process from a clean interpreter (no fork of JAX).
- `preload`: what that interpreter imports before it serves.
"""
