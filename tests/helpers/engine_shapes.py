"""Engine sizes for tests: warm up only the shapes the tests use.

tpu-inference precompiles one program per token-count bucket (powers of two
from 16 up to `max_num_batched_tokens`) and per request-count bucket (8 and
powers of two up to `max_num_seqs`) before an engine serves. The product's
CPU defaults (2048 tokens, 64 sequences) give 8 x 4 buckets; the serving
checks send 9 prompts of at most 67 tokens (about 170 in all, plus 32 new
tokens each, within the 256-token `max_model_len` they export), so 16
sequences and 256 tokens a step serve them in the same steps with 5 x 2
buckets. Tests with more requests than that queue them, as vLLM does.
"""

MAX_NUM_SEQS = 16
MAX_NUM_BATCHED_TOKENS = 256

# Keyword arguments for `KerasVllmEngine.from_export`.
ENGINE_KWARGS = {
    "max_num_seqs": MAX_NUM_SEQS,
    "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
}

# The same sizes as `vllm serve` / `keras-vllm serve` options.
SERVE_ARGS = [
    "--max-num-seqs",
    str(MAX_NUM_SEQS),
    "--max-num-batched-tokens",
    str(MAX_NUM_BATCHED_TOKENS),
]
