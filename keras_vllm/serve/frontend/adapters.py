"""Adapter loads checked before vLLM's `/v1/load_lora_adapter` sees them.

`keras-vllm serve ... --enable-lora` hands this module's middleware to
`vllm serve --middleware`. vLLM answers any error of its `add_lora` with a
500; the middleware instead checks the adapter completely against the base
served now (`load/adapter_checks.py`: its manifest, its stored factors'
dtypes and shapes, its base), in a thread off the event loop, and refuses a
bad one with a 400 naming the problem (and one line in the server's log,
`refusal_log`), before the engine reads it. A
`load_inplace` request is checked the same way (vLLM would otherwise answer
200 for a name it holds without reading the path). The worker runs the same
checks again where it reads the adapter (`serve/worker/lora_manager.py`).
"""

import asyncio
import os

ROUTE = "/v1/load_lora_adapter"
MIDDLEWARE = "keras_vllm.serve.frontend.adapters.adapter_middleware"


def served_base(request):
    """The base artifact this server serves now (after any reload)."""
    from keras_vllm.serve.frontend import reload as serve_reload

    return serve_reload.current_path() or os.path.abspath(
        request.app.state.args.model
    )


def _check(path, base, max_rank):
    from keras_vllm import format as fmt
    from keras_vllm.load import adapter_checks

    adapter_checks.check_adapter(
        adapter_checks.open_adapter(path),
        fmt.open_artifact(base, verify=False), max_rank,
    )


def error_response(message, status_code):
    """An error in vLLM's OpenAI error shape."""
    from fastapi.responses import JSONResponse

    kind = "ConflictError" if status_code == 409 else "BadRequestError"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None,
                   "code": status_code}},
        status_code=status_code,
    )


async def _refusal(request):
    from keras_vllm.errors import KerasVllmError
    from keras_vllm.serve.frontend import refusal_log

    try:
        body = await request.json()
        path = body.get("lora_path")
    except (ValueError, AttributeError):
        return None  # vLLM answers a malformed body itself
    if not isinstance(path, str) or not os.path.isdir(path):
        return None  # vLLM's own 404 (LoRAAdapterNotFoundError)
    args = request.app.state.args
    max_rank = int(getattr(args, "max_lora_rank", None) or 16)
    try:
        await asyncio.to_thread(
            _check, os.path.abspath(path), served_base(request), max_rank
        )
    except KerasVllmError as e:
        refusal_log.refused(e, request=request, status=400)
        return error_response(f"keras-vllm: {type(e).__name__}: {e}", 400)
    return None


async def adapter_middleware(request, call_next):
    """vLLM `--middleware`: refuses an adapter that would not serve."""
    if request.url.path.rstrip("/") == ROUTE and request.method == "POST":
        refusal = await _refusal(request)
        if refusal is not None:
            return refusal
    return await call_next(request)
