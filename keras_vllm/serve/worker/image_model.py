"""The tpu-inference model class of an artifact that serves images.

`KerasVllmForCausalLM` runs the backbone's own graph over token ids. A
vision-language backbone (Gemma 3 with its vision encoder) takes images
inside that graph, which vLLM cannot feed; tpu-inference's multimodal
interface splits the work instead, and this class maps it onto the
family's registered split (`layers.common.image_inputs.image_model`):

* `embed_multimodal(pixel_values=...)`: the Keras vision encoder over the
  pixels the front-end's processor made (`keras_vllm.serve.multimodal`),
  one `[tokens_per_image, hidden]` block per image (the runner caches them
  per image);
* `embed_input_ids(ids, embeddings, is_multimodal)`: the backbone's text
  embedding with the placeholders' rows replaced by the image rows;
* `__call__`: the decoder layers over those embeddings (or over the token
  ids' embeddings on steps without images), with each image's placeholders
  attending to their whole image through `ServingContext.attend_until`.

The runner passes `input_ids=None` on steps with images; keras-vllm's
runner fix (`keras_vllm.serve.worker.image_steps`) passes the ids too,
since they say where the placeholders are. Nothing here names a family.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from keras import ops

from keras_vllm import format as fmt
from keras_vllm.errors import ServingError
from keras_vllm.layers.common import image_inputs
from keras_vllm.layers.common.context import serving_context
from keras_vllm.serve.multimodal.processor import register_processor
from keras_vllm.serve.worker.model import KerasVllmForCausalLM

# The jitted vision encoder of each served artifact (`_encoder`).
_ENCODERS = {}
# The processor's arrays the encoder takes (`keras_vllm.hub.images.
# image_model_inputs`), as the family's `embed_images` names them.
_ENCODER_INPUTS = ("pixel_values", "pixel_position_ids")


@register_processor
class KerasVllmForConditionalGeneration(KerasVllmForCausalLM):
    """Serves a keras-vllm artifact whose manifest serves images.

    vLLM picks it by the artifact's architecture (`IMAGE_ARCHITECTURE`,
    format 1.10); users reach it through any entry point:

    ```python
    engine = keras_vllm.KerasVllmEngine.from_export("exports/gemma3_vision")
    engine.generate({"prompt": "<start_of_image> Describe it.",
                     "multi_modal_data": {"image": pil_image}})
    ```

    Chat rendering asks the class for the image marker
    (`get_placeholder_str`): it answers with the image artifact this
    process loaded last.

    Args: as `KerasVllmForCausalLM`.
    """

    supports_multimodal = True

    @classmethod
    def get_placeholder_str(cls, modality, i):
        """The text vLLM's chat rendering puts where an image part was:
        the artifact's image marker (the tokenizer expands it)."""
        from keras_vllm.serve.multimodal.processor import image_settings_of

        if modality.startswith("image"):
            return image_settings_of(None)["marker"]
        raise ValueError(f"This model takes no {modality} input.")

    def served_backbone(self, backbone, manifest):
        """The whole backbone: its vision encoder embeds the images."""
        settings = fmt.image_settings(manifest)
        model = image_inputs.image_model(type(backbone))
        if settings is None or model is None:
            raise ServingError(
                f"'{self._model_path}' names the image architecture, but "
                "its manifest has no image settings this keras-vllm can "
                "serve. Re-export the model."
            )
        scheduler = self.vllm_config.scheduler_config
        if getattr(scheduler, "enable_chunked_prefill", False) and not (
            getattr(scheduler, "disable_chunked_mm_input", False)
        ):
            # An image's placeholders see the whole image: its keys must
            # all be written in the step that computes them.
            raise ServingError(
                f"'{self._model_path}' serves images, whose placeholder "
                "tokens must not be split across prefill chunks. Serve it "
                "with `disable_chunked_mm_input=True` (`vllm serve PATH "
                "--disable-chunked-mm-input`); keras-vllm's engine and "
                "`keras-vllm serve` set it."
            )
        self.image_model = model
        self.placeholder_token_id = int(settings["placeholder_token_id"])
        self.tokens_per_image = int(settings["tokens_per_image"])
        self.bidirectional_images = (
            settings["attention"] == "bidirectional_within_image"
        )
        return backbone

    def embed_multimodal(self, **inputs):
        """The image rows: one `[tokens_per_image, hidden]` array per image
        of the processor's arrays (`pixel_values`: `[N, H, W, 3]`, or a
        variable-resolution converter's patches `[N, P, D]` with their
        `pixel_position_ids` `[N, P, 2]`)."""
        inputs = {
            name: jnp.asarray(np.asarray(inputs[name]))
            for name in _ENCODER_INPUTS
            if inputs.get(name) is not None
        }
        if "pixel_values" not in inputs:
            return []
        inputs["pixel_values"] = inputs["pixel_values"].astype(jnp.float32)
        rows = self._encoder()(nnx.state(self.backbone), inputs)
        # Each image's first `tokens_per_image` rows fill its placeholders
        # (an encoder may give more: Gemma 4's pads to its largest grid).
        return [rows[i, : self.tokens_per_image] for i in range(rows.shape[0])]

    def encoder_programs(self):
        """How many encoder programs this artifact has compiled (one per
        image count in a step; `bench.image_cost` reports it)."""
        entry = _ENCODERS.get(self._model_path)
        return 0 if entry is None else int(entry._cache_size())

    def _encoder(self):
        """The jitted vision encoder: `(backbone state, inputs) -> rows`.

        tpu-inference calls `embed_multimodal` outside its jitted step, on a
        model merged afresh each call, so the program is kept per artifact
        (one compile per image count) and the weights go in as arguments,
        not baked-in constants.

        Under tensor parallelism the weights lie where `sharding.py` put
        them: its rules key on the decoder's hidden size, and the encoder's
        layers are narrower (SigLIP's 1152 against Gemma 3 4B's 2560), so
        they stay whole on every device, and every device encodes all the
        step's images; only the projection into the decoder's width is
        split (one reduction). Left so on purpose: splitting the encoder
        would add a collective per encoder layer to a computation that runs
        once per image, to save its ~0.4B parameters (about a tenth of
        Gemma 3 4B, 1.5% of 27B) per device.
        """
        entry = _ENCODERS.get(self._model_path)
        if entry is None:
            graphdef, _ = nnx.split(self.backbone)
            image_model = self.image_model

            def encode(state, inputs):
                rows = image_model.embed_images(
                    nnx.merge(graphdef, state), **inputs
                )
                count = inputs["pixel_values"].shape[0]
                return jnp.reshape(rows, (count,) + rows.shape[-2:])

            entry = _ENCODERS[self._model_path] = jax.jit(encode)
        return entry

    def embed_input_ids(
        self, input_ids, multimodal_embeddings=None, is_multimodal=None
    ):
        """`[T, hidden]` token embeddings, placeholders replaced in order
        by the rows of `multimodal_embeddings` (`[M, hidden]`)."""
        embeddings = self.image_model.embed_tokens(
            self.backbone, ops.expand_dims(input_ids, 0)
        )[0]
        if multimodal_embeddings is None or is_multimodal is None:
            return embeddings
        return image_inputs.merge_image_embeddings(
            embeddings, multimodal_embeddings, is_multimodal
        )

    def __call__(
        self,
        kv_caches,
        input_ids,
        attention_metadata,
        inputs_embeds=None,
        input_positions=None,
        layer_name_to_kvcache_index=None,
        lora_metadata=None,
        intermediate_tensors=None,
        is_first_rank=True,
        is_last_rank=True,
        *args,
        **kwargs,
    ):
        context = self._serving_context(
            kv_caches, attention_metadata, lora_metadata,
            layer_name_to_kvcache_index, input_positions,
        )
        positions = context.positions
        num_tokens = positions.shape[0]
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        elif input_ids is not None and self.bidirectional_images:
            # Only steps with images pass embeddings: their placeholders
            # see their whole image.
            context.attend_until = image_inputs.image_span_limits(
                input_ids == self.placeholder_token_id,
                positions,
                context.token_requests(),
            )
        # vLLM's T tokens run as T sequences of one token.
        x = ops.expand_dims(inputs_embeds, axis=1)
        ones = ops.ones((num_tokens, 1), "int32")
        # The ids too: a family's layers may take per-token inputs of
        # their own (Gemma 4 E2B's per-layer embeddings).
        token_ids = image_mask = None
        if input_ids is not None:
            token_ids = ops.expand_dims(input_ids, axis=1)
            image_mask = token_ids == self.placeholder_token_id
        with serving_context(context):
            hidden = self.image_model.decode(
                self.backbone, x, ones, ops.zeros_like(ones),
                token_ids=token_ids, image_mask=image_mask,
            )
        context.check_all_used_once()
        return context.kv_caches, hidden[:, 0, :], [], None
