"""vLLM's multimodal processor for an artifact that serves images.

vLLM turns a request's images into model inputs in its front-end with a
processor registered on the model class (`register_processor`), normally
built on the Hugging Face processor of the model directory. A keras-vllm
artifact has none: its `manifest.modalities.image` says what KerasHub's
preprocessor does (`keras_vllm.hub.images`), and this processor does the
same with nothing executed from the artifact:

* text: keras-vllm's tokenizer expands each image marker of a prompt into
  the preprocessor's run of placeholder tokens before tokenizing (so the
  ids equal `generate()`'s, newlines included); the prompt update here only
  locates each image's run of placeholders (replaced by itself), which
  vLLM's scheduler and the runner's encoder cache key on;
* pixels: `image_model_inputs` (a KerasHub `ImageConverter` of the stored
  settings), one `[H, W, 3]` float32 block per image (`pixel_values`), or
  for a variable-resolution converter one block of patches per image with
  their positions (`pixel_values`, `pixel_position_ids`);
* limits: at most `max_images_per_prompt` images (the preprocessor's), or
  fewer with `--limit-mm-per-prompt`; dummy inputs for vLLM's profiling.
"""

from keras_vllm import format as fmt
from keras_vllm.errors import ServingError

# `{artifact path: modalities.image}` read in this process; the last one
# also answers `get_placeholder_str`, which vLLM asks of the class.
_SETTINGS = {}
_LAST = []


def image_settings_of(path):
    """The image settings of the artifact at `path` (None: the artifact
    this process read last).

    Raises:
        ServingError: when the artifact serves no image.
    """
    if path is None:
        if not _LAST:
            raise ServingError(
                "No artifact that serves images was loaded in this process."
            )
        return _LAST[-1]
    path = str(path)
    if path not in _SETTINGS:
        manifest = fmt.open_artifact(path).manifest
        settings = fmt.image_settings(manifest)
        if settings is None or "image" not in fmt.served_modalities(manifest):
            raise ServingError(
                f"'{path}' serves text only; it takes no image."
            )
        _SETTINGS[path] = settings
    _LAST[:] = [_SETTINGS[path]]
    return _SETTINGS[path]


def register_processor(model_cls):
    """Class decorator: registers this module's processor on `model_cls`
    with vLLM's multimodal registry."""
    from vllm.multimodal import MULTIMODAL_REGISTRY

    return MULTIMODAL_REGISTRY.register_processor(
        _processor_class(),
        info=_info_class(),
        dummy_inputs=_dummy_inputs_class(),
    )(model_cls)


def _info_class():
    from vllm.multimodal.processing import BaseProcessingInfo

    class KerasVllmProcessingInfo(BaseProcessingInfo):
        """What vLLM asks of an image artifact before processing."""

        @property
        def settings(self):
            return image_settings_of(self.ctx.model_config.model)

        def get_hf_processor(self, **kwargs):
            raise ServingError(
                "A keras-vllm artifact has no Hugging Face processor; its "
                "images are processed from manifest.modalities.image."
            )

        def get_supported_mm_processor_kwargs(self):
            # No per-request processor options: the exported converter's.
            return {"text_kwargs": set(), "images_kwargs": set()}

        def get_supported_mm_limits(self):
            return {"image": int(self.settings["max_images_per_prompt"])}

        def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
            return {"image": int(self.settings["tokens_per_image"])}

    return KerasVllmProcessingInfo


def _dummy_inputs_class():
    from vllm.multimodal.processing import BaseDummyInputsBuilder

    class KerasVllmDummyInputs(BaseDummyInputsBuilder):
        """Images of the converter's size and one marker each (vLLM's
        profiling run)."""

        def get_dummy_text(self, mm_counts):
            return self.info.settings["marker"] * mm_counts.get("image", 0)

        def get_dummy_mm_data(self, seq_len, mm_counts, mm_options):
            converter = self.info.settings["converter"]
            if converter.get("kind") == "patches":
                # A square image of the most patches the converter keeps.
                side = converter["patch_size"] * converter[
                    "pooling_kernel_size"
                ] * int(converter["max_soft_tokens"] ** 0.5)
                height = width = max(side, 1)
            else:
                height, width = converter["image_size"]
            return {
                "image": self._get_dummy_images(
                    width=width,
                    height=height,
                    num_images=mm_counts.get("image", 0),
                    overrides=(mm_options or {}).get("image"),
                )
            }

    return KerasVllmDummyInputs


def _processor_class():
    from vllm.multimodal.inputs import MultiModalFieldConfig
    from vllm.multimodal.processing import BaseMultiModalProcessor
    from vllm.multimodal.processing import PromptReplacement
    from vllm.multimodal.processing import PromptUpdateDetails

    class KerasVllmImageProcessor(BaseMultiModalProcessor):
        """Pixels as `generate()` feeds them; placeholder runs located."""

        def _call_hf_processor(self, hf_data, hf_kwargs):
            import torch
            from transformers import BatchFeature

            from keras_vllm.hub import images as hub_images

            inputs = hub_images.image_model_inputs(
                self.info.settings, list(hf_data.get("images") or [])
            )
            return BatchFeature(
                {k: torch.from_numpy(v) for k, v in inputs.items()}
            )

        def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
            return {
                name: MultiModalFieldConfig.batched("image")
                for name in ("pixel_values", "pixel_position_ids")
                if name in hf_inputs
            }

        def _get_prompt_updates(
            self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs
        ):
            settings = self.info.settings
            placeholder = int(settings["placeholder_token_id"])
            run = [placeholder] * int(settings["tokens_per_image"])
            # The tokenizer already expanded each marker (see the module
            # docstring): each image's run is found and kept as it is.
            return [
                PromptReplacement(
                    modality="image",
                    target=run,
                    replacement=PromptUpdateDetails.select_token_id(
                        run, placeholder
                    ),
                )
            ]

    return KerasVllmImageProcessor
