"""vLLM entry points (declared in pyproject.toml).

- `platform_plugin` (`vllm.platform_plugins`): on a machine without a TPU,
  selects tpu-inference's platform on JAX CPU devices (the CPU backend);
  on a TPU it returns None and vLLM's own detection runs.
- `register` (`vllm.general_plugins`): runs in every vLLM process; it
  registers the `keras_vllm` config type, the `KerasVllmForCausalLM`
  architecture and the `keras_vllm` tokenizer mode, applies the CPU
  backend's patches where there is no TPU, and installs the front-end
  checks and runner fixes (`serve/frontend/`, `serve/worker/`).

Every upstream function replaced in a vLLM process is replaced from
`register`, in the order below, through `keras_vllm.patching` (which checks
the pinned versions first).

Neither function initializes JAX: vLLM forks its engine process after
loading plugins, and a JAX runtime started before a fork aborts the child.
"""

import os

from keras_vllm import patching


def platform_plugin():
    """Returns tpu-inference's platform class path on a CPU-only host."""
    # vLLM resolves its platform while importing, well before it loads
    # general plugins: the earliest point to refuse `vllm serve BAD_DIR`.
    from keras_vllm.serve.frontend import refusals

    refusals.refuse_unservable_directory()
    from keras_vllm.cpu import detect

    return detect.platform_class_path()


def register():
    """Registers keras-vllm's config, model and tokenizer with vLLM."""
    from keras_vllm import _env  # noqa: F401
    from keras_vllm import envs
    from keras_vllm import logs

    logs.show_info_when_verbose()
    from keras_vllm.serve.frontend import refusals

    refusals.refuse_unservable_directory()
    # Everything below replaces private functions of exactly these versions.
    patching.check_versions()
    logs.drop_gloo_connected_lines()
    envs.KERAS_BACKEND.setdefault(envs.KERAS_BACKEND.default)
    from keras_vllm.serve.worker import compile_cache

    compile_cache.cache_every_program()
    from keras_vllm.serve.process import start as engine_process

    # A plain `vllm.LLM(artifact)` in a process running JAX (one that just
    # trained) must not fork its engine process, and in one holding the TPU
    # runs its engine itself (no process of its own could open the chip).
    engine_process.install()
    engine_process.run_here_if_holding_tpu()
    _keras_variables_reach_ray_workers()
    from keras_vllm.cpu import detect

    if detect.is_cpu_host():
        from keras_vllm.cpu import apply_patches

        apply_patches()

    from keras_vllm.hub import imports

    # Before the model and tokenizer modules below import keras-hub.
    imports.import_keras_hub()
    from keras_vllm import format as fmt
    from keras_vllm.serve import hf_config

    hf_config.register()

    from keras_vllm.serve.tokenizer import register as register_tokenizer

    register_tokenizer()
    from keras_vllm.serve.tokenizer import grammar

    # Structured outputs (xgrammar) over the artifact's tokenizer.
    grammar.install()

    from tpu_inference.models.common.model_loader import register_model

    from keras_vllm.serve.worker.model import KerasVllmForCausalLM

    register_model(fmt.ARCHITECTURE, KerasVllmForCausalLM)
    from keras_vllm.serve.worker.image_model import (
        KerasVllmForConditionalGeneration,
    )

    # Artifacts that serve images (their processor is on this class).
    register_model(fmt.IMAGE_ARCHITECTURE, KerasVllmForConditionalGeneration)
    from keras_vllm.format.assistant import ASSISTANT_ARCHITECTURE
    from keras_vllm.serve.worker.assistant_model import (
        KerasVllmAssistantForCausalLM,
    )

    # Assistant artifacts, drafting for their target (`method: "mtp"`).
    register_model(ASSISTANT_ARCHITECTURE, KerasVllmAssistantForCausalLM)
    from keras_vllm.serve.worker import draft_target

    # The drafter shares the served model's artifact and embedding.
    draft_target.install()
    # vLLM takes an assistant's config as an MTP drafter's.
    hf_config.install()
    from keras_vllm.serve.worker import image_steps

    # Steps with images reach the model with their token ids.
    image_steps.install()
    from keras_vllm.serve.frontend import sampling

    # Requests setting what the backend would not apply are refused.
    sampling.install()
    from keras_vllm.serve.frontend import encoder_tokens

    # Prompts holding ids only an unserved encoder embeds are refused.
    encoder_tokens.install()
    from keras_vllm.serve.worker import grammar_rows

    # Each structured request's grammar mask reaches its own batch slot.
    grammar_rows.install()
    from keras_vllm.serve import decode_steps

    # The scheduler of each engine process serves continue decode.
    decode_steps.install()
    from keras_vllm.serve.worker import resumed_tokens

    # A request back from preemption continues from its real tokens.
    resumed_tokens.install()
    from keras_vllm.serve.worker import prompt_lengths

    # Layers that read each token's prompt length (Phi-3's "su" RoPE).
    prompt_lengths.install()
    from keras_vllm.serve.worker import speculative_prompt_logprobs

    # Prompt logprobs on an engine that speculates, without stopping it.
    speculative_prompt_logprobs.install()
    from keras_vllm.serve.worker import draft_schedule

    # N-gram drafting steps aside by batch size and by acceptance.
    draft_schedule.install()
    from keras_vllm.serve.worker import state_caches

    # Layers with a recurrent state get vLLM state slots, not KV caches.
    state_caches.install()
    from keras_vllm.serve.frontend import chat_parts

    # Chat content parts an artifact cannot take are refused by name.
    chat_parts.install()
    from keras_vllm.serve.frontend import refusal_log

    # Requests the API server fails on a keras-vllm error: one log line.
    refusal_log.install()
    from keras_vllm.serve.frontend import shutdown

    # Requests running at SIGTERM end as aborted instead of hanging.
    shutdown.install()
    from keras_vllm.serve.worker import lora_runner

    # Multi-adapter serving (`--enable-lora`) of our model on the runner.
    lora_runner.install()
    _default_tokenizer_mode_for_artifacts()
    _serve_stored_dtype()
    _no_system_first_probe_without_template()


def _keras_variables_reach_ray_workers():
    """Adds `KERAS_` to the prefixes vLLM's Ray executor copies to workers.

    On a multi-host slice (tpu-inference's `TPU_MULTIHOST_BACKEND=ray`) the
    workers on other hosts see only the variables vLLM copies. Its Ray
    executor V2 (the default) copies the driver's whole environment where a
    node does not set a variable itself; its older Ray executor and its
    Ray-placed DP engines copy only vLLM's own and a few prefixes.
    `KERAS_BACKEND`, `KERAS_NNX_ENABLED` and keras-vllm's `KERAS_VLLM_*`
    must reach them for the model to build the same way.
    """
    from keras_vllm import envs

    prefixes = [
        p.strip()
        for p in (envs.RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY.raw() or "").split(",")
        if p.strip()
    ]
    if "KERAS_" not in prefixes:
        envs.RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY.set(
            ",".join(prefixes + ["KERAS_"])
        )


def _is_artifact(path):
    from keras_vllm import format as fmt

    manifest = os.path.join(str(path), fmt.MANIFEST_FILE)
    if not os.path.isfile(manifest):
        return False
    try:
        return fmt.read_json(manifest, follow=True).get("format") == fmt.FORMAT_NAME
    except Exception:  # any unreadable manifest is simply not ours
        return False


def _default_tokenizer_mode_for_artifacts():
    """Makes `tokenizer_mode="auto"` pick `keras_vllm` for our artifacts.

    vLLM 0.32 maps architectures to tokenizer modes with a hard-coded list,
    so plain `vllm serve ARTIFACT` would look for a Hugging Face tokenizer.
    This wraps vLLM's tokenizer-argument resolution (pinned 0.32.0,
    `vllm.tokenizers.registry.resolve_tokenizer_args`): for a directory that
    is a keras-vllm artifact, "auto" becomes "keras_vllm"; anything else is
    resolved exactly as before.
    """
    import functools

    from vllm.tokenizers import registry

    from keras_vllm import format as fmt

    def artifact_mode(original):
        @functools.wraps(original)
        def resolve(tokenizer_name, *args, tokenizer_mode="auto", **kwargs):
            if tokenizer_mode == "auto" and _is_artifact(tokenizer_name):
                tokenizer_mode = fmt.TOKENIZER_MODE
            return original(
                tokenizer_name, *args, tokenizer_mode=tokenizer_mode, **kwargs
            )

        return resolve

    resolve = patching.replace(
        registry, "resolve_tokenizer_args", artifact_mode
    )
    patching.replace(
        registry, "cached_resolve_tokenizer_args",
        lambda original: functools.lru_cache(resolve),
    )


def _serve_stored_dtype():
    """Makes `dtype="auto"` serve an artifact in the dtype it stores.

    vLLM 0.32 downcasts float32 models to bfloat16 under "auto"
    (`vllm.config.model._get_and_verify_dtype`, pinned 0.32.0), so plain
    `vllm serve ARTIFACT` of a float32 export would no longer match
    `generate()` token for token. For keras-vllm artifacts only, "auto"
    becomes the stored dtype (said once); an explicit other dtype is served
    as asked, with one line saying greedy output may then differ.
    """
    from vllm.config import model as model_config

    patching.replace(
        model_config, "_get_and_verify_dtype", _stored_dtype_by_default
    )


def _stored_dtype_by_default(original):
    import functools
    import logging

    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )

    from keras_vllm import format as fmt

    logger = logging.getLogger("keras_vllm")

    @functools.wraps(original)
    def get_and_verify_dtype(model_id, config, dtype, **kwargs):
        if getattr(config, "model_type", None) != fmt.MODEL_TYPE:
            return original(model_id, config, dtype, **kwargs)
        stored = ModelArchConfigConvertorBase.get_torch_dtype(
            config,
            model_id,
            revision=kwargs.get("revision"),
            config_format=kwargs.get("config_format", "hf"),
        )
        stored_name = str(stored).removeprefix("torch.")
        if isinstance(dtype, str) and dtype.lower() == "auto":
            logger.info(
                "keras-vllm: serving the artifact's stored dtype %s "
                "(--dtype changes it).",
                stored_name,
            )
            dtype = stored
        resolved = original(model_id, config, dtype, **kwargs)
        if resolved != stored:
            logger.warning(
                "keras-vllm: serving in %s an artifact stored in %s; greedy "
                "output may differ from CausalLM.generate().",
                str(resolved).removeprefix("torch."),
                stored_name,
            )
        return resolved

    return get_and_verify_dtype


def _no_system_first_probe_without_template():
    """Skips vLLM's chat-template probe for artifacts without a template.

    vLLM 0.32's Anthropic endpoint renders a [system, user, system, user]
    conversation at start-up (`AnthropicServingMessages.
    _should_merge_inline_system`, pinned 0.32.0) and, when there is no
    template, warns that "the chat template requires system-first ordering".
    An artifact exported without a template answers chat requests with a
    400 that says how to add one, so there is no ordering to warn about;
    artifacts with a template (and other models) are probed as before.
    """
    import sys

    # Only the API server serves that endpoint: other vLLM processes (the
    # engine's, `LLM`'s) are spared importing it.
    if not any(
        name.startswith("vllm.entrypoints.launchers") for name in sys.modules
    ):
        return
    try:
        from vllm.entrypoints.anthropic import serving
    except ImportError:  # the endpoint moved: nothing to skip
        return
    from keras_vllm.serve.tokenizer import KerasVllmTokenizer

    cls = serving.AnthropicServingMessages
    if "_should_merge_inline_system" not in cls.__dict__:
        return  # the probe moved: nothing to skip

    def without_template_probe(original):
        probe = original.__func__

        def should_merge(klass, online_renderer):
            tokenizer = getattr(online_renderer.renderer, "tokenizer", None)
            if (
                isinstance(tokenizer, KerasVllmTokenizer)
                and tokenizer.chat_template is None
                and online_renderer.chat_template is None
            ):
                return False
            return probe(klass, online_renderer)

        return classmethod(should_merge)

    patching.replace(
        cls, "_should_merge_inline_system", without_template_probe
    )
