"""Requests still running when the server stops end as aborted, not hung.

On SIGTERM, `vllm serve` (vLLM 0.32.0, default `--shutdown-timeout 0`)
has the engine abort its in-flight requests, stops the engine process and
then cancels the front end's output handler (`AsyncLLM.shutdown`). Whether
the engine's abort outputs reach a request's stream before that cancel is a
race, and a cancelled handler skips the code that would fail the rest
(`asyncio.CancelledError` is not an `Exception`). A lost race leaves every
open response waiting forever: no last chunk, no `[DONE]`, and uvicorn
waits for those connections before the process exits. Seen with
`keras-vllm serve` (2 of 2 tries, 16 requests of 240 tokens, SIGTERM 0.5 s
after them); with vLLM's INFO logging the race was won and every request
ended with `finish_reason: "abort"` in under 4 s.

`install()` wraps `AsyncLLM.shutdown`: after vLLM's own shutdown, any
request the front end still tracks gets that same final "abort" output, on
the event loop that serves it. Front ends serving a keras-vllm artifact
only; other models keep vLLM's method.
"""

import logging

from keras_vllm import patching

logger = logging.getLogger("keras_vllm")


def abort_pending(output_processor):
    """Ends every request the output processor still tracks as aborted.

    Args:
        output_processor: vLLM's `OutputProcessor`.

    Returns:
        The ids of the requests ended.
    """
    pending = list(output_processor.request_states)
    if not pending:
        return []
    return output_processor.abort_requests(pending, internal=True)


def install():
    """Rebinds `AsyncLLM.shutdown` (idempotent; keras-vllm's vLLM plugin
    calls it in every vLLM process)."""
    from vllm.v1.engine import async_llm

    patching.replace(async_llm.AsyncLLM, "shutdown", _aborting)


def _aborting(original):

    def shutdown(self, timeout=None):
        from keras_vllm.serve.hf_config import serves_artifact

        original(self, timeout=timeout)
        handler = getattr(self, "output_handler", None)
        processor = getattr(self, "output_processor", None)
        if handler is None or processor is None:
            return
        if not serves_artifact(getattr(self, "model_config", None)):
            return

        def end_requests():
            ended = abort_pending(processor)
            if ended:
                logger.warning(
                    "keras-vllm: the engine stopped with %d requests "
                    "running; they end as aborted.", len(ended),
                )

        # vLLM calls this from an executor thread; request queues belong to
        # the event loop.
        loop = handler.get_loop()
        if not loop.is_closed():
            try:
                loop.call_soon_threadsafe(end_requests)
            except RuntimeError:  # the loop closed meanwhile
                pass

    return shutdown
