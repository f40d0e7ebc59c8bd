"""vLLM's multimodal front-end for keras-vllm artifacts that serve images
(`processor`: pixels and placeholder ranges from the artifact alone)."""
