"""Every program of an engine goes to the persistent compile cache.

tpu-inference points JAX's persistent compilation cache at vLLM's
`VLLM_XLA_CACHE_PATH` (`~/.cache/vllm/xla_cache` by default) unless
`VLLM_DISABLE_COMPILE_CACHE` is set, so that a restarted engine loads its
programs instead of compiling them again. But JAX writes only programs that
took at least `jax_persistent_cache_min_compile_time_secs` (1 s) to compile,
and an engine's token and request buckets, its sampling and its logprob
programs mostly compile faster than that: on CPU all but a few, on TPU the
small ones. A second start then compiled nearly everything again.
`cache_every_program()` lowers the threshold to 0 in each vLLM process, unless
the caller set JAX's own variable (kept as given).

A changed artifact cannot run a stale program: JAX keys each entry by the
program itself (its HLO, with every constant folded in from the config),
the compile options, the devices and the jax/jaxlib versions, and an
artifact's weights are arguments of the programs, not part of them.
"""

from keras_vllm import envs


def cache_every_program():
    """Caches every program of this process in vLLM's compile cache.

    Lowers JAX's compile-time threshold to 0 (unless
    `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` is set) and points the cache
    at `VLLM_XLA_CACHE_PATH` now (unless `JAX_COMPILATION_CACHE_DIR` is set),
    so that the programs compiled while the model loads, before
    tpu-inference's runner sets the same directory, are cached too. Does
    nothing when `VLLM_DISABLE_COMPILE_CACHE` is set.

    Returns:
        The cache directory, or None when vLLM's compile cache is disabled.

    Example:

    >>> from keras_vllm import compile_cache
    >>> compile_cache.cache_every_program()  # doctest: +SKIP
    '/home/me/.cache/vllm/xla_cache'
    """
    import jax
    import vllm.envs as vllm_envs

    if vllm_envs.VLLM_DISABLE_COMPILE_CACHE:
        return None
    # Updating config values starts no backend: safe before vLLM forks.
    if envs.PERSISTENT_CACHE_MIN_COMPILE_TIME.raw() is None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if envs.COMPILATION_CACHE_DIR.raw() is None:
        jax.config.update(
            "jax_compilation_cache_dir", vllm_envs.VLLM_XLA_CACHE_PATH
        )
    return jax.config.jax_compilation_cache_dir
