"""`export_vllm()`: a fine-tuned KerasHub `CausalLM` -> an artifact on disk."""

import logging
import os

from keras_vllm import format as fmt
from keras_vllm.hub import presets
from keras_vllm import progress
from keras_vllm.hub import reference
from keras_vllm import signing
from keras_vllm.hub import checkpoint
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ExportError
from keras_vllm.errors import UnsupportedModelError
from keras_vllm.export import adapter as adapter_export
from keras_vllm.export import capabilities
from keras_vllm.export import chat_templates
from keras_vllm.export import checkpoint_tokenizer
from keras_vllm.export import delta
from keras_vllm.export import golden_images
from keras_vllm.export import model_facts
from keras_vllm.export import quantized
from keras_vllm.export import sections
from keras_vllm.export import staging
from keras_vllm.export.kv_layout import kv_layout

logger = logging.getLogger("keras_vllm")

DEFAULT_GOLDEN_PROMPTS = (
    "The",
    "Hello world",
    "What is the answer?",
    "one two three",
)


def export_vllm(
    causal_lm,
    path,
    *,
    preset=None,
    base=None,
    weights="auto",
    overwrite=False,
    golden_prompts=DEFAULT_GOLDEN_PROMPTS,
    golden_max_new_tokens=16,
    max_sequence_length=None,
    chat_template=None,
    allow_unservable=False,
    verbose="auto",
    signing_key=None,
    lora_dtype=None,
):
    """Exports a KerasHub `CausalLM` as a keras-vllm artifact directory.

    The artifact holds a manifest (format version, writer versions, preset
    reference, backbone/tokenizer/preprocessor/sampler classes and configs,
    SHA-256 of every file), a neutral vLLM `config.json`, a
    `generation_config.json` with the model's own sampler, the native
    KerasHub tokenizer assets, orbax weights and golden greedy outputs.
    It is written beside `path` and renamed into place only when complete.

    Args:
        causal_lm: a `keras_hub.models.CausalLM` with a preprocessor.
        path: the artifact directory to create.
        preset: the preset handle or local preset directory the model was
            fine-tuned from. Defaults to the one recorded when the model was
            loaded with `from_preset()` after `import keras_vllm`.
        base: for a model with LoRA enabled, an existing keras-vllm
            artifact the adapter applies to (bound by its manifest's
            SHA-256); `preset=` names a preset base instead.
        weights: `"auto"` (an adapter when LoRA is enabled and a base is
            known; else store only what differs from the preset, nothing
            if it equals it, everything without a preset or when every
            variable differs: then it depends on no preset), `"adapter"`
            (only the LoRA factors and any other variable that differs
            from the base), `"delta"`, `"full"` or `"preset"`.
        overwrite: replace an existing artifact at `path`.
        golden_prompts: prompts whose greedy outputs are recorded.
        golden_max_new_tokens: tokens generated per golden prompt.
        max_sequence_length: longest sequence to serve; defaults to the
            backbone's declared maximum, else the preprocessor's length.
        chat_template: a Jinja chat template (text, or a path to a file)
            stored for `/v1/chat/completions`. Defaults to the preset's
            own when the model came from a Hugging Face checkpoint that
            has one (`chat_template.jinja` or `tokenizer_config.json`), or
            the family's chat format when it came from an
            instruction-tuned KerasHub preset (e.g.
            `gemma2_instruct_2b_en`); `False` stores none.
        allow_unservable: export a backbone whose attention keras-vllm
            cannot serve on vLLM (for Keras-side use only). By default such
            a model is refused, naming the attention class.
        verbose: `"auto"` draws one progress line per phase on a terminal
            (not in CI); `True` also prints the phases elsewhere; `False`
            prints nothing. Phases always log at INFO to `keras_vllm`.
        signing_key: path of a PEM elliptic-curve private key, or a
            `keras_vllm.signing.Signer` (a key with a password, or
            certificate-based signing): the artifact is signed with OpenSSF
            model-signing (`model.sig`, over every other file) before it is
            published, so it appears signed or not at all.
        lora_dtype: for an adapter export, the dtype its LoRA factors are
            stored in: None (float32, as Keras trains them: exact),
            `"float32"`, `"bfloat16"` or `"float16"`. The 16-bit dtypes
            halve the adapter's bytes but round the factors, so the model
            served or loaded from the artifact differs slightly from the
            exporting one; golden outputs are recorded with the rounded
            factors (the exporting model itself is left unchanged).
            Refused on any other export.

    Returns:
        The absolute path of the artifact.

    Example:

    ```python
    import keras_vllm
    causal_lm = keras_hub.models.CausalLM.from_preset("gemma2_2b_en")
    causal_lm.fit(data, epochs=1)
    causal_lm.export_vllm("exports/gemma2_tuned")
    ```
    """
    model_facts.check_model(causal_lm)
    # Refused by its structure before anything else is read.
    refused = capabilities.refusal(causal_lm)
    if refused is not None and not allow_unservable:
        raise UnsupportedModelError(
            f"{refused} To export it for Keras-side use only, pass "
            "`allow_unservable=True`."
        )
    model_facts.check_preprocessor(causal_lm)
    target = staging.check_target(path, overwrite)
    # The key and the factor dtype are checked before any work is done.
    signer = None if signing_key is None else signing.as_signer(signing_key)
    adapter_export.check_lora_dtype(lora_dtype)
    with progress.verbosity(verbose):
        return _export(
            causal_lm, target, preset, weights, overwrite, golden_prompts,
            golden_max_new_tokens, max_sequence_length, chat_template,
            allow_unservable, signer, base, lora_dtype, refused,
        )


def _export(
    causal_lm, target, preset, weights, overwrite, golden_prompts,
    golden_max_new_tokens, max_sequence_length, chat_template,
    allow_unservable, signer, base=None, lora_dtype=None, refused=None,
):
    if weights not in ("auto",) + fmt.WEIGHT_MODES:
        raise ExportError(
            f"weights='{weights}' is not one of 'auto', 'adapter', 'delta', "
            "'full', 'preset'."
        )
    backbone = causal_lm.backbone
    preprocessor = causal_lm.preprocessor
    tokenizer = preprocessor.tokenizer
    serialized = {
        "backbone": sections.serialize(backbone, "backbone"),
        "causal_lm": sections.serialize(causal_lm, "causal_lm"),
        "preprocessor": sections.serialize(preprocessor, "preprocessor"),
        "sampler": sections.serialize(causal_lm.sampler, "sampler"),
    }
    serialized["causal_lm"]["config"] = {}
    dtype = model_facts.dtype_name(backbone)
    quantization = quantized.section(backbone, dtype)
    if quantization is not None:
        serialized["backbone"] = quantized.neutral_backbone_config(
            serialized["backbone"], dtype
        )
    if base is not None and preset is not None:
        raise ExportError(
            "Pass either `base=` (an artifact) or `preset=` as the adapter's "
            "base, not both."
        )
    handle = (
        None if base is not None
        else model_facts.preset_handle(causal_lm, preset)
    )
    if handle is not None:
        checkpoint_tokenizer.warn_if_converted_differently(tokenizer, handle)
    chat_template = chat_templates.resolve(chat_template, handle, tokenizer)
    chat_templates.warn_if_no_start_token(
        chat_template, preprocessor, tokenizer
    )
    as_adapter = adapter_export.wanted(weights, backbone, base, handle)
    adapter_export.check_lora_dtype_applies(lora_dtype, as_adapter, weights)
    if weights in ("delta", "preset") and handle is None:
        raise ExportError(
            f"weights='{weights}' needs the preset the model came from: pass "
            "`preset=` (a handle or a local preset directory)."
        )
    stop_ids = reference.default_stop_token_ids(tokenizer)
    if golden_prompts and reference.pads_with_stop_token(tokenizer, stop_ids):
        logger.warning(
            "keras-vllm: this model's generate() stops before its first "
            "token: its tokenizer pads with id %s, which is also an end "
            "token, and keras-hub's sampler stops on padding. vLLM serves "
            "it normally; golden outputs are recorded as generate() runs "
            "with other padding.", tokenizer.pad_token_id,
        )
    max_len = model_facts.max_sequence_length(
        causal_lm, max_sequence_length, handle
    )
    # The conformance gate: fails before any file is written (and before
    # any golden output is recorded) when the model is no text decoder
    # keras-vllm runs or an attention layer has no paged subclass.
    try:
        if refused is not None:
            raise UnsupportedModelError(refused)
        quantized.check_servable(quantization)
        config = fmt.vllm_files.vllm_config(
            hidden_size=backbone.hidden_dim,
            vocab_size=backbone.vocabulary_size,
            max_sequence_length=max_len,
            dtype=dtype,
            tie_word_embeddings=getattr(backbone, "tie_word_embeddings", True),
            stop_token_ids=stop_ids,
            bos_token_id=getattr(tokenizer, "start_token_id", None),
            pad_token_id=getattr(tokenizer, "pad_token_id", None),
            kv_layout=kv_layout(backbone),
            serves_images=sections.image_settings(causal_lm) is not None,
        )
        unservable = None
    except UnsupportedModelError as e:
        if not allow_unservable:
            raise UnsupportedModelError(
                f"{e} To export it for Keras-side use only, pass "
                "`allow_unservable=True`."
            ) from None
        config, unservable = None, str(e)
        golden_prompts = _text_golden_prompts(causal_lm, golden_prompts)
    golden_ref = sections.golden_reference(causal_lm, unservable is None)

    with progress.phase("collecting weights", unit="variables") as phase:
        all_weights = weight_io.backbone_weights(backbone)
        quantized.check_values(backbone, all_weights)
        phase.advance(len(all_weights))
    order = {path: i for i, path in enumerate(all_weights)}
    preset_section = None
    adapter_section = None
    variable_index = order
    if as_adapter:
        with progress.phase("collecting LoRA factors") as phase:
            planned = adapter_export.plan(
                backbone, serialized["backbone"], dtype, target, base, handle,
                lora_dtype,
            )
            phase.advance(len(planned.stored))
        stored, mode = planned.stored, "adapter"
        preset_section, adapter_section = planned.preset, planned.adapter
        variable_index = planned.variables
    elif handle is not None and weights != "full":
        with progress.phase(f"comparing with preset '{handle}'") as phase:
            preset_section = {
                "handle": handle,
                "files": presets.hash_preset(handle),
            }
            stored = delta.against_preset(
                backbone,
                all_weights,
                handle,
                dtype,
                weight_io.quantized_layers(backbone) if quantization else {},
            )
            phase.advance(len(stored))
            phase.unit = "variables differ"
        if weights == "preset" and stored:
            raise ExportError(
                f"weights='preset' but {len(stored)} variables differ from "
                f"'{handle}' (e.g. '{sorted(stored)[0]}'). Use 'auto'."
            )
        mode = "delta" if stored else "preset"
        if weights == "delta":
            mode = "delta"
        elif len(stored) == len(all_weights):
            # Every variable differs (a full fine-tune, or a quantized model
            # over a float checkpoint): a delta would store them all and
            # still pin the preset, which serving hosts must then have.
            # Stored full, the preset named for provenance only.
            stored, mode = all_weights, "full"
            preset_section = {"handle": handle, "files": {}}
    else:
        if handle is not None:
            preset_section = {"handle": handle, "files": {}}
        stored, mode = all_weights, "full"

    with staging.staged_directory(target, overwrite) as tmp:
        # Recorded with the factors as stored (rounded by `lora_dtype`;
        # None unless this is an adapter export: `check_lora_dtype_applies`),
        # while the other files are written.
        def as_stored():
            return adapter_export.factors_as_stored(backbone, lora_dtype)

        recording = sections.golden_alongside(
            causal_lm, golden_prompts, golden_max_new_tokens, stop_ids,
            golden_ref, as_stored, max_len,
        )
        with recording as pending_golden:
            serialized["tokenizer"] = sections.tokenizer_section(tokenizer, tmp)
            sampler_mapped = _write_files(
                tmp, stored, config, serialized["sampler"], stop_ids,
                getattr(tokenizer, "start_token_id", None), chat_template,
            )
            # Hashed while the golden outputs are still being generated.
            with progress.phase("writing checksums", unit="bytes") as phase:
                files = fmt.file_table(tmp, on_bytes=phase.advance)
        golden = pending_golden.result()
        fmt.write_json(os.path.join(tmp, fmt.GOLDEN_FILE), golden)
        if golden_prompts and config is not None and (
            fmt.IMAGE_ARCHITECTURE in config["architectures"]
        ):  # Image prompts too (format 1.11), with the model as stored.
            golden_images.record(causal_lm, tmp, golden_max_new_tokens,
                                 stop_ids, max_len, as_stored)
        files.update(
            fmt.file_table(
                tmp, exclude={*files, fmt.MANIFEST_FILE, fmt.SIGNATURE_FILE}
            )
        )
        manifest = fmt.new_manifest(
            written_by=sections.versions(),
            preset=preset_section,
            dtype=dtype,
            stop_token_ids=stop_ids,
            max_sequence_length=max_len,
            sampler_in_vllm=sampler_mapped,
            unservable_reason=unservable,
            parameter_count=backbone.count_params(),
            weights={
                "mode": mode,
                "format": "orbax",
                "directory": fmt.WEIGHTS_DIR if stored else None,
                "lora": "factors" if as_adapter else "merged",
                "variables": {
                    p: {
                        "shape": list(v.shape),
                        "dtype": str(v.dtype),
                        "index": variable_index[p],
                    }
                    for p, v in sorted(stored.items())
                    if p in variable_index
                },
                "bytes": int(sum(v.nbytes for v in stored.values())),
                "total_variables": len(all_weights),
            },
            sections=serialized,
            files=files,
            golden_reference=golden_ref,
            quantization=quantization,
            adapter=adapter_section,
            unserved_inputs=capabilities.extra_inputs(backbone),
            prefix_caching=sections.prefix_caching(causal_lm, unservable),
            image=sections.image_settings(causal_lm),
        )
        fmt.write_json(os.path.join(tmp, fmt.MANIFEST_FILE), manifest)
        if signer is not None:
            with progress.phase("signing"):
                signer.sign(tmp)
    logger.info("keras-vllm: exported %s (%s weights)", target, mode)
    return target


def _text_golden_prompts(causal_lm, golden_prompts):
    """No golden outputs for an unservable model whose `generate()` needs
    inputs text prompts do not give (images): nothing serves them."""
    from keras_vllm.layers.swap import text_decoder_config

    backbone = causal_lm.backbone
    extra = capabilities.extra_inputs(backbone)
    if golden_prompts and extra and text_decoder_config(backbone) is None:
        logger.warning(
            "keras-vllm: no golden outputs recorded: %s's generate() needs "
            "inputs %s besides text.", type(causal_lm).__name__,
            ", ".join(extra),
        )
        return ()
    return golden_prompts


def _write_files(
    tmp, stored, config, sampler, stop_ids, start_token_id, chat_template
):
    """Writes the weights, vLLM's configs and the chat template into `tmp`.

    Returns:
        Whether vLLM's generation config maps the Keras sampler.
    """
    if stored:
        with progress.phase("writing weights", unit="bytes") as phase:
            checkpoint.save_weights(os.path.join(tmp, fmt.WEIGHTS_DIR), stored)
            phase.advance(sum(v.nbytes for v in stored.values()))
    if config is not None:
        fmt.write_json(os.path.join(tmp, fmt.CONFIG_FILE), config)
    gen_config, sampler_mapped = fmt.vllm_files.generation_config(
        sampler["registered_name"], sampler["config"], stop_ids, start_token_id
    )
    fmt.write_json(os.path.join(tmp, fmt.GENERATION_CONFIG_FILE), gen_config)
    if chat_template is not None:
        path = os.path.join(tmp, fmt.CHAT_TEMPLATE_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(chat_template)
    return sampler_mapped
