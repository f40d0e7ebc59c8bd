"""Many LoRA adapters served by one `KerasVllmEngine` over their base.

`KerasVllmEngine.from_export(base, adapters={"support": a, "legal": b})`
turns on vLLM's own LoRA machinery (`enable_lora`, `max_loras`,
`max_lora_rank`): each request names its adapter by a `LoRARequest(name,
int id, path)`, vLLM's scheduler puts at most `max_loras` distinct
adapters in one step (more wait their turn), and the engine's LoRA manager
(`keras_vllm/serve/worker/lora_manager.py`) reads the adapter artifact from that
path into a slot of the served model. Every adapter given at start is
verified and checked against the base here, before vLLM starts.
"""

import os

from keras_vllm.errors import ServingError

# vLLM 0.32's allowed `max_lora_rank` values (`vllm.config.lora.MaxLoRARanks`).
ALLOWED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class AdapterSet:
    """The adapters an engine serves: `name -> LoRARequest`.

    Args:
        base: the served base's opened `keras_vllm.format.Artifact`.
        max_lora_rank: the engine's largest adapter rank.
    """

    def __init__(self, base, max_lora_rank):
        self.base = base
        self.max_lora_rank = max_lora_rank
        self.requests = {}
        self._next_id = 1

    def check(self, name, path):
        """Verifies an adapter for this base; returns its absolute path."""
        from keras_vllm.load import adapter_checks

        if not isinstance(name, str) or not name:
            raise ServingError(f"Adapter names are non-empty strings, not {name!r}.")
        path = os.path.abspath(os.fspath(path))
        adapter_checks.check_adapter(
            adapter_checks.open_adapter(path), self.base, self.max_lora_rank
        )
        return path

    def add(self, name, path):
        """Registers a checked adapter under `name`; returns its request."""
        from vllm.lora.request import LoRARequest

        if name in self.requests:
            raise ServingError(
                f"An adapter named '{name}' is served already; remove it first."
            )
        request = LoRARequest(name, self._next_id, path)
        self._next_id += 1
        self.requests[name] = request
        return request

    def lora_requests(self, adapter, count):
        """vLLM's `lora_request` argument for `count` prompts.

        Args:
            adapter: None (the base), an adapter name, or one name (or None)
                per prompt.
            count: how many prompts.
        """
        if adapter is None:
            return None
        if isinstance(adapter, str):
            return self._request(adapter)
        adapter = list(adapter)
        if len(adapter) != count:
            raise ServingError(
                f"`adapter` names {len(adapter)} adapters for {count} prompts; "
                "give one name (or None for the base) per prompt."
            )
        return [None if a is None else self._request(a) for a in adapter]

    def _request(self, name):
        request = self.requests.get(name)
        if request is None:
            raise ServingError(
                f"No adapter named {name!r} is served (served: "
                f"{sorted(self.requests)}). Pass it in `adapters=` or "
                "`engine.add_adapter(name, path)`."
            )
        return request


def lora_engine_kwargs(artifact, adapters, max_loras, max_lora_rank,
                       overrides):
    """Checks the adapters and returns `(AdapterSet, vLLM LoRA kwargs)`.

    Returns `(None, {})` when no adapters are asked for.

    Raises:
        ServingError, ArtifactError: before vLLM starts, naming the adapter.
    """
    if adapters is None and max_loras is None:
        if max_lora_rank is not None:
            raise ServingError("max_lora_rank needs `adapters=` or `max_loras=`.")
        return None, {}
    from keras_vllm.load import adapter_checks

    if artifact.manifest["weights"]["mode"] == "adapter":
        raise ServingError(
            f"'{artifact.path}' is an adapter artifact; serve adapters over their base: "
            "`KerasVllmEngine.from_export(base, adapters={name: path})`."
        )
    adapters = dict(adapters or {})
    opened = {
        name: adapter_checks.open_adapter(os.path.abspath(os.fspath(path)))
        for name, path in adapters.items()
    }
    ranks = [
        t["rank"] for adapter in opened.values()
        for t in adapter.manifest["adapter"]["targets"].values()
    ]
    if max_lora_rank is None:
        needed = max(ranks, default=ALLOWED_RANKS[2])
        max_lora_rank = next((r for r in ALLOWED_RANKS if r >= needed), needed)
    if max_lora_rank not in ALLOWED_RANKS:
        raise ServingError(
            f"max_lora_rank={max_lora_rank} is not one of vLLM's ranks "
            f"{ALLOWED_RANKS}."
        )
    max_loras = max(1, len(adapters)) if max_loras is None else int(max_loras)
    if max_loras < 1:
        raise ServingError(f"max_loras={max_loras}; it must be at least 1.")
    served = AdapterSet(artifact, max_lora_rank)
    for name, adapter in opened.items():
        served.add(name, served.check(name, adapter.path))
    kwargs = {
        "enable_lora": True,
        "max_loras": max_loras,
        "max_lora_rank": max_lora_rank,
        # Every adapter given at start stays in the worker's host memory.
        "max_cpu_loras": max(max_loras, len(adapters)),
    }
    for key in list(kwargs):
        if key in overrides:
            raise ServingError(
                f"Pass {key} through `adapters=`/`max_loras=`/"
                "`max_lora_rank=`, not as an engine keyword."
            )
    return served, kwargs


def preload(llm, served):
    """Adds the adapters given at start to the worker (`add_lora`), so each
    is read and checked there now, not inside the first step that uses it
    (an error there would stop the engine)."""
    for request in served.requests.values():
        try:
            llm.llm_engine.add_lora(request)
        except Exception:
            llm.llm_engine.engine_core.shutdown()
            raise


def add_adapter(engine, name, path):
    """Checks an adapter and adds it to a running engine (no recompile:
    the worker reads it into host memory; a step that uses it writes it
    into a free slot)."""
    served = adapter_set(engine)
    request = served.add(name, served.check(name, path))
    with engine._lock:
        engine._check_running()
        try:
            engine.llm.llm_engine.add_lora(request)
        except Exception:
            served.requests.pop(name, None)
            raise
    return request


def remove_adapter(engine, name):
    """Removes an adapter from a running engine (its slot is freed)."""
    served = adapter_set(engine)
    request = served._request(name)
    with engine._lock:
        engine._check_running()
        engine.llm.llm_engine.remove_lora(request.lora_int_id)
    del served.requests[name]


def adapter_set(engine):
    if engine.adapters is None:
        raise ServingError(
            "This engine serves no adapters; start it with `adapters=` or "
            "`max_loras=` (`KerasVllmEngine.from_export(base, adapters=...)`)."
        )
    return engine.adapters
