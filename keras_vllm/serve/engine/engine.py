"""`KerasVllmEngine`: a vLLM engine over a keras-vllm artifact."""

import gc
import logging
import os
import threading

from keras_vllm import envs
from keras_vllm import format as fmt
from keras_vllm import logs
from keras_vllm import progress
from keras_vllm.serve import preflight
from keras_vllm.serve.engine import adapters as engine_adapters
from keras_vllm.serve.engine import sampling_defaults
from keras_vllm.serve.engine import updates
from keras_vllm.serve.frontend import modality_checks
from keras_vllm.serve.process import start as engine_process

logger = logging.getLogger("keras_vllm")


class KerasVllmEngine:
    """A vLLM engine (continuous batching, paged KV cache) over an artifact.

    Use `KerasVllmEngine.from_export(path)`; `.llm` is the `vllm.LLM`.

    Example:

    ```python
    engine = keras_vllm.KerasVllmEngine.from_export("exports/gemma2_tuned")
    outputs = engine.generate(["The quick brown fox"])
    print(outputs[0].outputs[0].text)
    ```
    """

    def __init__(self, llm, artifact, preset=None, public_key=None,
                 adapters=None):
        self.llm = llm
        # `engine_adapters.AdapterSet` of a multi-adapter engine, else None.
        self.adapters = adapters
        # The served `keras_vllm.format.Artifact` (replaced by an update).
        self.artifact = artifact
        # The served manifest's SHA-256 (None after a live-model update).
        self.artifact_hash = fmt.manifest_hash(artifact.path)
        self._preset, self._public_key = preset, public_key
        # vLLM's `LLM` is synchronous: one generate or update at a time.
        self._lock = threading.RLock()
        self._live_updates = 0
        # Whether the served weights may be the caller's own arrays (after
        # an in-process update from a live model): kept at shutdown.
        self._caller_arrays = False
        updates.label_weights(self)

    @classmethod
    def from_export(cls, path, verbose="auto", preset=None, public_key=None,
                    adapters=None, max_loras=None, max_lora_rank=None,
                    **engine_kwargs):
        """Starts a vLLM engine on a keras-vllm artifact.

        The artifact is verified first (its signature when a public key is
        required, checksums, manifest, consistency of its files, class
        allowlist, preset availability, tokenizer), in this process, so a
        bad artifact or setting is refused before vLLM starts. Sampling
        defaults come from the exported model's compiled sampler
        (`generation_config.json`), `max_model_len` from the artifact. Any `vllm.LLM` keyword argument
        overrides the defaults.

        vLLM's start-up logs are kept to warnings and errors unless
        `verbose=True` (or `KERAS_VLLM_VERBOSE=1`); on a terminal one
        progress line per phase shows what is happening.

        Args:
            path: the artifact directory.
            verbose: `"auto"` draws progress lines on a terminal (not in CI);
                `True` prints the phases and all of vLLM's logs; `False`
                prints neither.
            preset: where a delta artifact's preset is loaded from, instead
                of the handle its manifest records (e.g. a copy on an
                offline host); its files must hash to the recorded values.
                Defaults to `KERAS_VLLM_PRESET`, else the recorded handle.
            public_key: path of a PEM public key the artifact must be signed
                by (`model.sig`); checked before anything else of it is read,
                here and in vLLM's engine process. Defaults to
                `KERAS_VLLM_PUBLIC_KEY`; unset, no signature is needed.
            adapters: `{name: adapter artifact}` of LoRA adapters of this
                base, served per request (`generate(..., adapter=name)`);
                each is checked here, before vLLM starts.
            max_loras: distinct adapters one step can serve (vLLM queues
                requests of more); defaults to the number of `adapters`.
            max_lora_rank: the largest adapter rank (one of vLLM's ranks);
                defaults to the smallest that fits `adapters`.
            **engine_kwargs: passed to `vllm.LLM`.

        Returns:
            A `KerasVllmEngine`.
        """
        from keras_vllm import _env  # noqa: F401
        from keras_vllm.hub import imports

        imports.import_keras_hub()
        from keras_vllm.cpu import detect
        from keras_vllm.cpu import devices

        path = os.path.abspath(os.fspath(path))
        with progress.verbosity(verbose):
            # Everything the engine process would refuse is refused here, in
            # this process and without starting JAX, before vLLM starts (and
            # before its memory profiling run), as `vllm serve` refuses it.
            # Adapters turn vLLM's LoRA on: judged with the other settings.
            lora = adapters is not None or max_loras is not None
            plan = preflight.check(
                path, dict(engine_kwargs, **({"enable_lora": True} if lora
                                             else {})),
                preset, public_key, deep=True, verbose="auto",
            )
            # The engine process verifies the files again before it reads
            # them: nothing checked here is trusted there (format/opened.py).
            kwargs, preset = plan.engine_kwargs, plan.preset
            served, lora_kwargs = engine_adapters.lora_engine_kwargs(
                plan.artifact, adapters, max_loras, max_lora_rank,
                engine_kwargs,
            )
            kwargs.update(lora_kwargs)
            if detect.is_cpu_host():
                # The engine serves on CPU devices, also where this
                # process imported JAX before JAX_PLATFORMS was set.
                devices.pin_imported_jax_to_cpu()
            engine_process.choose()
            loud = verbose is True or envs.VERBOSE.get()
            if public_key is not None:
                public_key = os.path.abspath(os.fspath(public_key))
            with logs.serving_logs(loud), preflight.for_engine(
                {envs.PRESET: preset, envs.PUBLIC_KEY: public_key}
            ), progress.phase(
                "starting the vLLM engine (load, compile, warm up)", live=not loud
            ):
                import vllm

                from keras_vllm.serve import plugin

                # vLLM loads entry points in each process it starts;
                # registering here too covers an in-process engine and
                # editable installs.
                plugin.register()
                with engine_process.skips_main(), \
                        engine_process.forks_frozen():
                    llm = vllm.LLM(**kwargs)
                if served is not None:
                    engine_adapters.preload(llm, served)
        return cls(llm, plan.artifact, preset=preset, public_key=public_key,
                   adapters=served)

    @property
    def path(self):
        """The served artifact's directory."""
        return self.artifact.path

    @property
    def manifest(self):
        """The served artifact's manifest."""
        return self.artifact.manifest

    def shutdown(self):
        """Stops the vLLM engine and frees its weights, KV cache and processes.

        The engine cannot generate afterwards. `with` does this on exit:

        ```python
        with keras_vllm.KerasVllmEngine.from_export(path) as engine:
            outputs = engine.generate(["The quick brown fox"])
        ```
        """
        with self._lock:  # after a generate or update running in a thread
            llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None and updates.in_process(llm):
            # Its arrays freed now, whatever still references the engine
            # (the worker method says who does); not the caller's own.
            try:
                llm.collective_rpc("keras_vllm_release_device_memory",
                                   args=(not self._caller_arrays,))
            except Exception as e:  # Shutting down goes on regardless.
                logger.warning("keras-vllm: the engine's device memory is "
                               "freed when Python collects it (%s).", e)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            import psutil

            try:
                engine_core.shutdown()
            except psutil.NoSuchProcess:
                # vLLM lists the engine process's children while it exits
                # (`kill_process_tree`); gone is what shutdown wants.
                pass
        # An engine in this process holds its objects in reference cycles
        # (vLLM's engine, executor and runner point at each other).
        del llm, engine_core
        gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.shutdown()

    def check_golden(self):
        """Replays the artifact's golden prompts through this engine.

        The golden outputs were recorded at export with the reference the
        manifest names (`golden_reference`), greedy, up to the first stop
        token; image prompts too in an artifact that serves images (format
        1.11). `keras-vllm verify --engine` runs this.

        Returns:
            A list of `(prompt, expected_ids, served_ids)` for mismatches
            (empty when the engine reproduces every recorded output).
        """
        from keras_vllm.serve.engine import golden

        return golden.check_golden(self)

    def weights_layout(self):
        """How the served weights lie on the engine's devices.

        Read in vLLM's worker, from the arrays the jitted step runs on.

        Example:

        ```python
        engine = KerasVllmEngine.from_export(path, tensor_parallel_size=2)
        layout = engine.weights_layout()
        layout["devices"]  # bytes of weights on each device
        layout["variables"]["backbone/token_embedding/embeddings"]["spec"]
        ```

        Returns:
            The first worker's `{"devices": [bytes, ...], "variables":
            {path: {"shape", "dtype", "spec", "bytes"}}}`.
        """
        with self._lock:
            return self.llm.collective_rpc("keras_vllm_weights")[0]

    def kv_pages_per_replica(self):
        """KV-cache pages holding data, one count per data-parallel replica
        (`data_parallel_size`; one replica without it).

        Each replica caches the requests it serves in its own pages, so a
        replica that served nothing yet has none (tpu-inference routes each
        request to one replica for its lifetime).

        Example:

        ```python
        engine = KerasVllmEngine.from_export(path, data_parallel_size=2)
        engine.generate(prompts)
        engine.kv_pages_per_replica()  # e.g. [12, 11]
        ```
        """
        with self._lock:
            return self.llm.collective_rpc("keras_vllm_kv_pages")[0]

    def update_weights(self, source):
        """Replaces the served weights, without a restart or a recompile.

        `source` is a new export of the served model (same architecture,
        dtype, tokenizer and vLLM files; other weights), verified as
        `from_export` verifies it, or a live `CausalLM` (in vLLM's default
        multiprocess mode it is written to a temporary full export first;
        an in-process engine takes its arrays). Anything else is
        refused (`ServingError`) before a weight is written, and the old
        weights serve on. The update and `generate()` wait for each other,
        so each request is answered by one set of weights; see
        docs/UPDATES.md.

        Example:

        ```python
        engine = KerasVllmEngine.from_export("exports/step_100")
        engine.update_weights("exports/step_200")
        engine.artifact_hash  # the manifest hash of exports/step_200
        ```

        Args:
            source: an artifact directory, or a KerasHub `CausalLM`.

        Returns:
            `{"variables", "bytes", "seconds"}`: what the worker wrote and
            how long the whole update took.
        """
        return updates.update_weights(self, source)

    def _check_running(self):
        if "llm" not in self.__dict__:
            raise RuntimeError(
                "This KerasVllmEngine was shut down; start a new one with "
                "`KerasVllmEngine.from_export(path)`."
            )

    def add_adapter(self, name, path):
        """Serves another LoRA adapter of the base, without a recompile.

        Example: `engine.add_adapter("medical", "exports/medical")`.
        """
        engine_adapters.add_adapter(self, name, path)

    def remove_adapter(self, name):
        """Stops serving the adapter `name` (its slot is freed)."""
        engine_adapters.remove_adapter(self, name)

    def generate(self, prompts, sampling_params=None, adapter=None, **kwargs):
        """Generates completions; see `vllm.LLM.generate`.

        Example (a multi-adapter engine):

        ```python
        engine.generate(["Hi", "Hi"], params, adapter=["support", None])
        ```

        Args:
            prompts: a string, a list of strings, or vLLM prompt dicts
                (e.g. `{"prompt_token_ids": [...]}`).
            sampling_params: `vllm.SamplingParams`; defaults to the exported
                model's own sampler and `generate()`'s length: new tokens
                up to the preprocessor's `sequence_length` in all (vLLM's
                own default would stop at 16).
            adapter: an adapter name for every prompt, or one name (None:
                the base) per prompt; None serves the base.

        Returns:
            A list of vLLM `RequestOutput`.
        """
        count = 1 if isinstance(prompts, (str, dict)) else len(prompts)
        return self._call("generate", prompts, count, sampling_params,
                          adapter, kwargs)

    def chat(self, messages, sampling_params=None, adapter=None, **kwargs):
        """Answers conversations with the artifact's chat template; see
        `vllm.LLM.chat`.

        Example:

        ```python
        outputs = engine.chat([{"role": "user", "content": "Hi!"}])
        print(outputs[0].outputs[0].text)
        ```

        Args:
            messages: one conversation (a list of `{"role", "content"}`
                messages) or a list of them.
            sampling_params: `vllm.SamplingParams`; defaults as in
                `generate` (the rendered chat counts as the prompt).
            adapter: as in `generate`, one name or one per conversation.

        Raises:
            ServingError: the artifact has no chat template and the call
                passes none (`chat_template=`).

        Returns:
            A list of vLLM `RequestOutput`, one per conversation.
        """
        one = not messages or isinstance(messages[0], dict)
        count = 1 if one else len(messages)
        return self._call("chat", messages, count, sampling_params, adapter,
                          kwargs)

    def _check_chat_template(self, kwargs):
        """Refuses chat on an artifact without a template (and none given)
        here, before vLLM's renderer turns it into its own error."""
        if kwargs.get("chat_template") is not None:
            return
        if fmt.CHAT_TEMPLATE_FILE in self.manifest.get("files", {}):
            return
        from keras_vllm.errors import ServingError

        raise ServingError(
            f"'{self.path}' has no chat template, so chat messages cannot be "
            "turned into a prompt. Re-export the model with one "
            "(`causal_lm.export_vllm(path, chat_template=...)`: Jinja text "
            "or a .jinja file; KerasHub instruct presets and Hugging Face "
            "checkpoints store theirs by default), pass one for this call "
            "(`engine.chat(messages, chat_template=...)`), or send plain "
            "prompts with `engine.generate`."
        )

    def _call(self, method, inputs, count, sampling_params, adapter, kwargs):
        modality_checks.check_request(method, inputs, self.manifest)
        with self._lock:
            self._check_running()
            if method == "chat":
                self._check_chat_template(kwargs)
            if sampling_params is None:
                sampling_params = sampling_defaults.default_sampling_params(
                    self.llm, self.manifest, method, inputs, kwargs
                )
            if adapter is not None:
                served = engine_adapters.adapter_set(self)
                kwargs["lora_request"] = served.lora_requests(adapter, count)
            return getattr(self.llm, method)(inputs, sampling_params, **kwargs)

