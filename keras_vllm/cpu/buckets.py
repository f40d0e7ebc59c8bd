"""Token buckets on CPU: a one-sequence decode step computes one row.

tpu-inference pads every step's tokens up to a bucket (powers of two from
`MIN_TOKEN_BUCKET`, 16 by default, up to `max_num_batched_tokens`) and
compiles one program per bucket. On a TPU 16 rows cost what one does. On
CPU they cost 16x the arithmetic of the model: a single sequence's decode
step on the ~128M-parameter benchmark model took 55.9 ms in the 16-token
bucket and 42.3 ms with 1-token buckets, against 43 ms for KerasHub's own
`generate()` (docs/benchmarks.md, "The smallest token bucket").

So on CPU the engine gets one more bucket, of one token per data-parallel
replica (tpu-inference's `compilation_sizes`, which joins its bucket list;
its buckets count the tokens of all replicas, each replica's share
splitting evenly over the mesh's `data` axis): one more program to
compile per engine start, not the four of `MIN_TOKEN_BUCKET=1`. Steps of
2-16 tokens keep the 16-token bucket. A user's own `MIN_TOKEN_BUCKET` or
`compilation_sizes` is left as given.

An engine that speculates (`speculative_config`) gets one more: a lone
sequence's verify step (its token and `num_speculative_tokens` drafts)
computes that many rows, not 16 (docs/benchmarks.md, "Speculative
decoding").
"""

import logging
import os

logger = logging.getLogger("keras_vllm")

ONE_TOKEN = 1
# tpu-inference's smallest bucket by default (its `MIN_TOKEN_BUCKET`).
SMALLEST_DEFAULT_BUCKET = 16


def add_one_token_bucket(vllm_config):
    """Adds a 1-token bucket to a CPU engine's config, unless the user chose
    (and, when it speculates, a bucket of one token plus its drafts).

    Args:
        vllm_config: the `VllmConfig` being finalized (on a CPU host).

    Returns:
        Whether the bucket was added.
    """
    if os.environ.get("MIN_TOKEN_BUCKET"):
        return False
    additional = getattr(vllm_config, "additional_config", None)
    if not isinstance(additional, dict):
        return False
    if "compilation_sizes" in additional:
        return False
    # After tpu-inference's `check_and_update_config`: its sharding config
    # holds the data-parallel size (vLLM's own is reset to 1 by then).
    sharding = getattr(vllm_config, "sharding_config", None)
    replicas = int(getattr(sharding, "total_dp_size", 1) or 1)
    sizes = [ONE_TOKEN * replicas]
    speculative = getattr(vllm_config, "speculative_config", None)
    drafts = int(getattr(speculative, "num_speculative_tokens", 0) or 0)
    if 0 < drafts < SMALLEST_DEFAULT_BUCKET - 1:
        sizes.append((1 + drafts) * replicas)
    additional["compilation_sizes"] = sizes
    logger.debug("keras-vllm: CPU token buckets %s added.", sizes)
    return True
