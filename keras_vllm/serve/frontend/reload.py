"""`POST /v1/keras_vllm/reload` in vLLM's API server (`--enable-reload`).

`keras-vllm serve --enable-reload` hands this module's middleware to
`vllm serve --middleware` (vLLM 0.32 adds an ASGI function middleware per
option), so the route exists only when asked for. The middleware:

* answers `POST /v1/keras_vllm/reload {"path": ARTIFACT}`: the artifact is
  checked as `KerasVllmEngine.update_weights` checks it (in a thread, off
  the event loop), vLLM's scheduler is paused (`pause_generation(mode=
  "wait")`: requests already running finish, new ones queue) with its
  caches cleared, the worker replaces the weights
  (`KerasVllmWorkerExtension.keras_vllm_update_from_artifact`), the weight
  version becomes the artifact's manifest hash and the scheduler resumes;
* adds `"keras_vllm": {"artifact_hash", "path"}` to each model card of
  `GET /v1/models`.

A reload while LoRA adapters are loaded (`--enable-lora`) is refused with
a 409 naming every loaded adapter that does not fit the new base (an
adapter exported against the served artifact never does): they are not
unloaded behind the client's back; unload them, reload, then load adapters
of the new base. The worker refuses the same case on its own
(`KerasLoraManager.check_new_base`) and checks later adapter loads against
the base it serves now.

It runs before vLLM's own authentication middleware, so it checks the
server's `--api-key` (or `VLLM_API_KEY`, as vLLM does) itself; a server
without a key takes reloads from loopback clients only. Every answer but a
200 is also one line in the server's log (`refusal_log`).
"""

import asyncio
import hmac
import json
import os

RELOAD_ROUTE = "/v1/keras_vllm/reload"
MIDDLEWARE = "keras_vllm.serve.frontend.reload.reload_middleware"
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


class _Served:
    """What this API server process serves (one per process)."""

    path = None
    manifest = None
    hash = None
    lock = None


_SERVED = _Served()


def current_path():
    """The artifact served now (None before the first request)."""
    return _SERVED.path


def _misfits(loaded, base):
    """Names of the loaded adapters that do not fit the opened `base`."""
    from keras_vllm.errors import KerasVllmError
    from keras_vllm.load import adapter_checks

    misfits = []
    for name, lora in sorted(loaded.items()):
        try:
            adapter_checks.check_adapter(
                adapter_checks.open_adapter(lora.lora_path), base, 512
            )
        except KerasVllmError:
            misfits.append(name)
    return misfits


async def _served(request):
    """The served artifact, read once; names vLLM's weight version."""
    if _SERVED.lock is None:
        from keras_vllm import format as fmt

        path = os.path.abspath(request.app.state.args.model)
        _SERVED.manifest = fmt.open_artifact(path, verify=False).manifest
        _SERVED.path, _SERVED.hash = path, fmt.manifest_hash(path)
        _SERVED.lock = asyncio.Lock()
        await request.app.state.engine_client.update_weight_version(_SERVED.hash)
    return _SERVED


def _api_keys(request):
    from vllm import envs as vllm_envs

    keys = getattr(request.app.state.args, "api_key", None)
    return [key for key in (keys or [vllm_envs.VLLM_API_KEY]) if key]


def _refused(request, error, status_code):
    """The route's JSON error for `error`, logged (`refusal_log`)."""
    from fastapi.responses import JSONResponse

    from keras_vllm.serve.frontend import refusal_log

    refusal_log.refused(
        error, request=request, route=f"POST {RELOAD_ROUTE}",
        status=status_code,
    )
    return JSONResponse({"error": str(error)}, status_code=status_code)


def _refusal(request):
    """A JSON error response, or None when the client may reload."""
    from keras_vllm.errors import AccessError

    keys = _api_keys(request)
    if keys:
        given = request.headers.get("Authorization", "")
        if not any(
            hmac.compare_digest(given.encode(), f"Bearer {key}".encode())
            for key in keys
        ):
            return _refused(request, AccessError(
                "Reloading needs the server's API key "
                "(`Authorization: Bearer KEY`, `keras-vllm reload "
                "--api-key KEY`)."
            ), 401)
        return None
    host = request.client.host if request.client else None
    if host not in _LOOPBACK:
        return _refused(request, AccessError(
            "This server has no --api-key, so it takes reloads from its "
            "own host (loopback) only. Start it with --api-key to reload "
            "from elsewhere."
        ), 403)
    return None


async def _reload(request):
    from fastapi.responses import JSONResponse

    from keras_vllm.load import update_checks
    from keras_vllm import envs
    from keras_vllm.errors import KerasVllmError
    from keras_vllm.errors import RequestError
    from keras_vllm.errors import ServingError

    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    try:
        body = await request.json()
        path = body["path"]
        if not isinstance(path, str) or not path:
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return _refused(request, RequestError(
            'The request body must be {"path": ARTIFACT_DIR}.'
        ), 400)
    served = await _served(request)
    client = request.app.state.engine_client
    path = os.path.abspath(path)
    preset, public_key = envs.PRESET.get(), envs.PUBLIC_KEY.get()
    async with served.lock:
        try:
            artifact, digest = await asyncio.to_thread(
                update_checks.check_export,
                served.manifest, path, preset, public_key,
            )
        except KerasVllmError as e:
            return _refused(request, e, 400)
        # Adapters bound to the served base would serve on the new one:
        # refused (409) while any is loaded; unload them first.
        models = getattr(request.app.state, "openai_serving_models", None)
        loaded = dict(getattr(models, "lora_requests", None) or {})
        misfits = await asyncio.to_thread(_misfits, loaded, artifact)
        if misfits:
            return _refused(request, ServingError(
                f"The loaded LoRA adapters {misfits} do not fit the new "
                f"base '{path}' (they were exported against the served "
                "one); nothing was replaced. Unload them first (`POST "
                "/v1/unload_lora_adapter`), or load adapters exported "
                "against the new base after the reload."
            ), 409)
        await client.pause_generation(mode="wait", clear_cache=True)
        try:
            result = (
                await client.collective_rpc(
                    "keras_vllm_update_from_artifact",
                    args=(path, preset, public_key, digest),
                )
            )[0]
            await client.update_weight_version(digest)
        except Exception as e:  # the worker's errors arrive as many types
            return _refused(request, e, 500)
        finally:
            await client.resume_generation()
        served.path, served.manifest = path, artifact.manifest
        served.hash = digest
    return JSONResponse(
        {"artifact_hash": digest, "path": path, **result}, status_code=200
    )


async def _with_artifact(request, response):
    """`/v1/models` with the served artifact in each model card."""
    from fastapi.responses import JSONResponse

    body = b"".join([chunk async for chunk in response.body_iterator])
    served = await _served(request)
    try:
        models = json.loads(body)
        for card in models.get("data", []):
            card["keras_vllm"] = {
                "artifact_hash": served.hash, "path": served.path,
            }
    except (ValueError, AttributeError, TypeError):
        from starlette.responses import Response

        return Response(body, status_code=response.status_code,
                        headers=dict(response.headers))
    return JSONResponse(models, status_code=response.status_code)


async def reload_middleware(request, call_next):
    """vLLM `--middleware`: the reload route and `/v1/models` metadata."""
    route = request.url.path.rstrip("/")
    if route == RELOAD_ROUTE and request.method == "POST":
        return await _reload(request)
    await _served(request)
    response = await call_next(request)
    if route == "/v1/models" and response.status_code == 200:
        return await _with_artifact(request, response)
    return response
