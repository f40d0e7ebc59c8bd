"""The tiny configuration of each test family's backbone.

`keras_vllm.testing.models` builds the models from this table: one entry
per family, `(KerasHub class prefix, backbone constructor arguments)`,
each the shape of a real preset's config shrunk down (see
`keras_vllm.testing.models` for the sizes).
"""

FAMILIES = [
    "gpt2",
    "opt",
    "llama",
    "llama3",
    "mistral",
    "mixtral",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma4",
    "gemma4_e2b",
    "gemma3n",
    "qwen",
    "qwen3",
    "qwen_moe",
    "qwen3_moe",
    "phi3",
    "falcon",
    "bloom",
    "gpt_neo_x",
    "smollm3",
    "gpt_oss",
    "qwen3_5",
    "qwen3_5_moe",
]

# Backbone arguments the tokenizer's vocabulary size fills in, per family
# (`vocabulary_size` for the others).
VOCABULARY_KEYS = {"gemma3n": ("text_vocab_size", "vocab_size_per_layer_input")}

NUM_LAYERS = 2
HIDDEN_DIM = 64
INTERMEDIATE_DIM = 128
NUM_QUERY_HEADS = 4
NUM_KEY_VALUE_HEADS = 2
HEAD_DIM = 16
SLIDING_WINDOW = 16

# Llama 3.1's RoPE frequency scaling ("rope_type": "llama3" in the HF
# config), mapped onto `Llama3Backbone` arguments.
LLAMA3_1_ROPE_SCALING = {
    "rope_max_wavelength": 500000,
    "rope_frequency_adjustment_factor": 8.0,
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_pretraining_sequence_length": 8192,
}

# Overrides that switch the tiny Phi-3 to the "su" (LongRoPE) scaled rotary
# embedding of the 128k-context Phi-3 presets: one short and one long factor
# per rotary frequency (head_dim // 2 of them), and a maximum sequence length
# above the pretraining one so the long factors are used.
PHI3_SU_ROPE_SCALING = {
    "rope_scaling_type": "su",
    "rope_scaling_short_factor": [1.0, 1.0, 1.05, 1.1, 1.2, 1.5, 2.0, 2.5],
    "rope_scaling_long_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0],
    "max_sequence_length": 256,
    "pretraining_sequence_length": 64,
}

_GQA = {
    "num_layers": NUM_LAYERS,
    "num_query_heads": NUM_QUERY_HEADS,
    "num_key_value_heads": NUM_KEY_VALUE_HEADS,
    "hidden_dim": HIDDEN_DIM,
    "intermediate_dim": INTERMEDIATE_DIM,
}
_MHA = {
    "num_layers": NUM_LAYERS,
    "num_heads": NUM_QUERY_HEADS,
    "hidden_dim": HIDDEN_DIM,
    "intermediate_dim": INTERMEDIATE_DIM,
}
_GEMMA = dict(_GQA, head_dim=HEAD_DIM)

# family -> (class name prefix in `keras_hub.models`, backbone kwargs).
# `vocabulary_size` is filled in from the tokenizer.
SPECS = {
    "gpt2": ("GPT2", dict(_MHA, max_sequence_length=128, dropout=0.0)),
    "opt": ("OPT", dict(_MHA, max_sequence_length=128, dropout=0.0)),
    # Llama 2: SentencePiece, untied embeddings, RoPE base 10000.
    "llama": ("Llama", dict(_GQA, tie_word_embeddings=False)),
    # Llama 3.1: byte-level BPE, RoPE base 500000 with Llama 3.1 scaling.
    "llama3": (
        "Llama3",
        dict(_GQA, tie_word_embeddings=False, **LLAMA3_1_ROPE_SCALING),
    ),
    "mistral": (
        "Mistral",
        dict(_GQA, head_dim=HEAD_DIM, sliding_window=SLIDING_WINDOW),
    ),
    "mixtral": (
        "Mixtral",
        dict(_GQA, num_experts=4, top_k=2, sliding_window=SLIDING_WINDOW),
    ),
    # Gemma 1 (2B shape): multi-query attention.
    "gemma": ("Gemma", dict(_GEMMA, num_key_value_heads=1)),
    # Gemma 2: the Gemma backbone with the Gemma 2 flags. Sliding window
    # attention applies to every other layer (layer 0 of 2).
    "gemma2": (
        "Gemma",
        dict(
            _GEMMA,
            query_head_dim_normalize=False,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            attention_logit_soft_cap=50.0,
            final_logit_soft_cap=30.0,
            use_sliding_window_attention=True,
            sliding_window_size=SLIDING_WINDOW,
        ),
    ),
    # Gemma 3, text only (1B shape): q/k norms, post norms, sliding window on
    # 5 of every 6 layers (`num_layers=6` reaches the first global layer).
    "gemma3": (
        "Gemma3",
        dict(
            _GEMMA,
            image_size=896,
            vision_encoder=None,
            query_head_dim_normalize=True,
            use_query_key_norm=True,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            use_sliding_window_attention=True,
            sliding_window_size=SLIDING_WINDOW,
        ),
    ),
    # Gemma 4, text only, large shape (31B / 26B-A4B-like): q/k RMSNorm and
    # v norm, attention scale 1, sliding window on 5 of every 6 layers
    # (`num_layers=6` reaches the first global layer); global layers with a
    # wider head, one KV head with keys equal to values, and partial
    # ("proportional") RoPE. `position_ids` is a backbone input. As in
    # 26B-A4B, every layer runs a dense FFN and 4 experts (top 2) in
    # parallel (`enable_moe_block=False` gives the 31B shape).
    "gemma4": (
        "Gemma4",
        dict(
            _GEMMA,
            image_size=16,
            vision_encoder=None,
            sliding_window_size=SLIDING_WINDOW,
            global_head_dim=2 * HEAD_DIM,
            num_global_key_value_heads=1,
            global_rope_partial_rotary_factor=0.25,
            enable_moe_block=True,
            num_experts=4,
            expert_intermediate_dim=32,
            num_experts_per_token=2,
        ),
    ),
    # Gemma 4, text only, small dense shape (E2B/E4B-like): also a wider
    # head on global layers (256 / 512 in the presets; here 16 / 160, whose
    # caches are laid out 128 / 256 wide, so the two kinds of layers have
    # caches of different page sizes as there) but as many KV heads (no
    # K=V); per-layer embeddings; the last 2 layers share the KV cache of
    # the last earlier layer of their kind (3 and 2) and have a double-wide
    # MLP; the presets' final logit soft cap of 30.
    "gemma4_e2b": (
        "Gemma4",
        dict(
            _GEMMA,
            num_layers=6,
            layer_types=["sliding_attention", "sliding_attention",
                         "full_attention"] * 2,
            image_size=16,
            vision_encoder=None,
            sliding_window_size=SLIDING_WINDOW,
            global_head_dim=10 * HEAD_DIM,
            global_rope_partial_rotary_factor=0.25,
            hidden_size_per_layer_input=8,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            final_logit_soft_cap=30.0,
        ),
    ),
    # Gemma 3n, text only (E2B/E4B shape): the decoder nested in the
    # backbone; q/k RMSNorm and v norm, attention scale 1; sliding window
    # on 2 of every 3 layers (4 of 5 in the presets); 4 AltUp streams;
    # Laurel blocks; per-layer inputs; Gaussian top-k activation sparsity
    # (0.95) in the first 2 layers' FFNs (the first 10 in the presets); the
    # last 2 layers share the KV cache of the last earlier layer of their
    # kind (3 and 2); the presets' final logit soft cap of 30. Its sizes are
    # `text_vocab_size` and `vocab_size_per_layer_input` (`VOCABULARY_KEYS`).
    "gemma3n": (
        "Gemma3n",
        {
            "text_hidden_size": HIDDEN_DIM,
            "num_hidden_layers": 6,
            "pad_token_id": 0,
            "num_attention_heads": NUM_QUERY_HEADS,
            "num_key_value_heads": NUM_KEY_VALUE_HEADS,
            "head_dim": HEAD_DIM,
            "intermediate_size": [INTERMEDIATE_DIM] * 6,
            "hidden_activation": "gelu_approximate",
            "layer_types": ["sliding_attention", "sliding_attention",
                            "full_attention"] * 2,
            "sliding_window": SLIDING_WINDOW,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "max_position_embeddings": 256,
            "hidden_size_per_layer_input": 8,
            "altup_num_inputs": 4,
            "altup_coef_clip": 120.0,
            "laurel_rank": 4,
            "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
            "num_kv_shared_layers": 2,
            "final_logit_soft_cap": 30.0,
        },
    ),
    # Qwen 2 / 2.5: q/k/v biases, tied embeddings, RoPE base 1e6.
    "qwen": ("Qwen", dict(_GQA, rope_max_wavelength=1000000)),
    # Qwen 3: q/k norms, explicit head size, tied embeddings.
    "qwen3": (
        "Qwen3",
        dict(_GQA, head_dim=HEAD_DIM, rope_max_wavelength=1000000),
    ),
    "qwen_moe": (
        "QwenMoe",
        dict(
            _GQA,
            moe_intermediate_dim=32,
            shared_expert_intermediate_dim=64,
            num_experts=4,
            top_k=2,
            rope_max_wavelength=1000000,
        ),
    ),
    "qwen3_moe": (
        "Qwen3Moe",
        dict(
            _GQA,
            head_dim=HEAD_DIM,
            moe_intermediate_dim=32,
            num_experts=4,
            top_k=2,
            rope_max_wavelength=1000000,
        ),
    ),
    # Qwen 3.5 (text): 3 Gated DeltaNet linear-attention layers then one
    # gated full-attention layer (q/k norm, 25% partial RoPE), as every 4
    # layers of the presets; 2 key and 4 value heads on the linear layers
    # (the presets' 1:2 ratio).
    "qwen3_5": (
        "Qwen3_5",
        dict(
            _GQA,
            num_layers=4,
            head_dim=HEAD_DIM,
            rope_max_wavelength=1000000,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=HEAD_DIM,
            linear_value_head_dim=HEAD_DIM,
        ),
    ),
    # Qwen 3.5 MoE: Qwen 3.5's layers with a sparse block (4 experts, top
    # 2, always renormalised) and a sigmoid-gated shared expert in place of
    # the MLP. One linear and one full-attention layer: both kinds, at half
    # the tiny Qwen 3.5's cost (the chunked delta rule dominates its compile
    # and fine-tune time; `qwen3_5` keeps the presets' 3:1 pattern).
    "qwen3_5_moe": (
        "Qwen3_5Moe",
        dict(
            {k: v for k, v in _GQA.items() if k != "intermediate_dim"},
            num_layers=2,
            layer_types=["linear_attention", "full_attention"],
            head_dim=HEAD_DIM,
            rope_max_wavelength=1000000,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=HEAD_DIM,
            linear_value_head_dim=HEAD_DIM,
            moe_intermediate_dim=32,
            shared_expert_intermediate_size=64,
            num_experts=4,
            top_k=2,
        ),
    ),
    # Phi-3 (4k-context shape). Pass `**PHI3_SU_ROPE_SCALING` for "su" RoPE.
    "phi3": (
        "Phi3",
        dict(_GQA, max_sequence_length=128, pretraining_sequence_length=128),
    ),
    # Falcon (RW-1B shape): multi-head attention with ALiBi.
    "falcon": (
        "Falcon",
        {
            "num_layers": NUM_LAYERS,
            "num_attention_heads": NUM_QUERY_HEADS,
            "hidden_dim": HIDDEN_DIM,
            "intermediate_dim": INTERMEDIATE_DIM,
        },
    ),
    # Bloom: multi-head attention with ALiBi.
    "bloom": ("Bloom", dict(_MHA, dropout=0.0)),
    # GPT-NeoX (Pythia shape): fused QKV, 25% partial rotary, parallel
    # residual.
    "gpt_neo_x": (
        "GPTNeoX",
        dict(_MHA, max_sequence_length=128, dropout=0.0),
    ),
    # SmolLM3 (3B shape): no RoPE ("NoPE") on every 4th layer, so 4 layers
    # reach one; RoPE base 5M, tied embeddings, no biases.
    "smollm3": (
        "SmolLM3",
        {
            "num_layers": 4,
            "num_attention_heads": NUM_QUERY_HEADS,
            "num_key_value_heads": NUM_KEY_VALUE_HEADS,
            "hidden_dim": HIDDEN_DIM,
            "intermediate_dim": INTERMEDIATE_DIM,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "rope_layer_enabled_list": [True, True, True, False],
            "layer_types": ["full_attention"] * 4,
            "mlp_bias": False,
            "layer_norm_epsilon": 1e-6,
            "max_position_embeddings": 128,
            "rope_theta": 5000000.0,
            "partial_rotary_factor": 1.0,
        },
    ),
    # GPT-OSS: attention sinks with head size 64 (every preset's, and the
    # only one tpu-inference's sink kernel takes), YaRN RoPE as the presets
    # (base 150000, factor 32), KerasHub's window on odd layers (layer 1 of
    # 2), 4 experts top 2 (clamped SwiGLU with biases).
    "gpt_oss": (
        "GptOss",
        dict(
            _GQA,
            head_dim=64,
            num_experts=4,
            top_k=2,
            sliding_window=SLIDING_WINDOW,
            rope_max_wavelength=150000,
            rope_scaling_factor=32.0,
        ),
    ),
}
