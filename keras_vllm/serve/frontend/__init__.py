"""keras-vllm's parts of vLLM's front end (`LLM`, the API server).

- `refusals`: one-line refusals of `vllm serve DIR` before vLLM starts.
- `reload`: `POST /v1/keras_vllm/reload` (`--enable-reload`).
- `sampling`: sampling parameters tpu-inference would ignore, refused.
- `shutdown`: requests still running at shutdown end as aborted.
- `adapters`: adapter loads (`--enable-lora`) checked before vLLM's route.
- `modality_checks`: requests with inputs the artifact does not serve.
- `chat_parts`: chat content parts (images, audio, video) checked against
  what the artifact serves, and unreadable images named (400 over HTTP).
- `refusal_log`: each of these refusals as one line in the server's log.
"""
