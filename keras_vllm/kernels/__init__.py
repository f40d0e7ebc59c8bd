"""Pure-JAX attention kernels over tpu-inference's paged KV caches.

Jittable `lax` code with no Pallas, so it runs on any JAX backend. It knows
nothing of keras-vllm's artifact, layers or CPU backend; those call it:

* `ragged_paged_attention`: ragged paged attention with a cache write, and
  options for sliding windows, soft caps, ALiBi slopes and attention sinks.
* `write_kv_cache`: the cache write alone.
"""

from keras_vllm.kernels.kv_cache import write_kv_cache
from keras_vllm.kernels.ragged_attention import ragged_paged_attention

__all__ = ["ragged_paged_attention", "write_kv_cache"]
