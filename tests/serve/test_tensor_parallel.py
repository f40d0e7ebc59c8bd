"""Tensor-parallel serving on virtual JAX CPU devices, token for token.

One engine per (family, TP size), for one family per attention mechanism,
each on the same fine-tuned tiny model as the single-device serving tests
(`test_serving_families.py` shows TP=1 serving equals `generate()`, so equal
tokens here are equal to TP=1 as well). The test process trained the models,
so JAX already runs here with one CPU device: the engine process starts from
a clean interpreter (the fork server) and gets its devices by itself.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("tpu_inference")

from helpers import family_serving  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm import format as fmt  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402
from keras_vllm.serve.frontend import refusals  # noqa: E402
from keras_vllm.serve.worker import capacity  # noqa: E402
from keras_vllm.load import tensor_parallel  # noqa: E402

# One family per mechanism the mesh must split correctly.
MECHANISMS = {
    "llama": "rotary GQA; 2 KV heads, repeated over 4 devices",
    "gpt2": "learned positions, multi-head attention",
    "gemma2": "attention soft cap and sliding window",
    "mixtral": "mixture of experts",
    "bloom": "ALiBi",
    "qwen3": "query/key norms",
}
# TP=2 and TP=4 for every mechanism (the tiny models' 4 query heads divide
# both); at 4, Llama-style GQA models also have more devices than KV heads
# (tpu-inference repeats them, and the KV cache is padded).
# GPT-OSS at TP=2 only: attention sinks split with their heads (tpu-inference
# shards them over the heads axis), routed experts with biases split along
# their intermediate size, a sliding window on one layer.
# Gemma 4 at TP=2, both tiny shapes: `gemma4` (mixed head sizes, one K=V
# global KV head repeated over the devices, dense FFN and routed experts in
# parallel) and `gemma4_e2b` (per-layer embeddings, layers reading another
# layer's cache, double-wide MLP, final soft cap).
# Qwen 3.5 at TP=2: Gated DeltaNet layers split by heads (2 key, 4 value
# heads), their fused `[Q | K | V]` channels reordered per shard and their
# conv/delta-rule state slots split with them; one gated full-attention
# layer. Its family engine settings (4 state slots, 32-token chunked
# prefill), so the state also crosses chunks on the split mesh.
# Qwen 3.5 MoE at TP=2: the same split of the linear layers, plus routed
# experts (fused `[gate | up]`) and the sigmoid-gated shared expert.
# Gemma 3n at TP=2: its decoder nested in the backbone, q/k/v/o as plain
# `Dense` layers (split by the rows / columns rules), AltUp, Laurel and
# per-layer input projections, KV-shared layers, its token embedding a plain
# `Embedding` split over the vocabulary.
TP_CASES = (
    [(family, 2) for family in MECHANISMS]
    + [(family, 4) for family in MECHANISMS]
    + [("gpt_oss", 2), ("gemma4", 2), ("gemma4_e2b", 2), ("qwen3_5", 2)]
    + [("qwen3_5_moe", 2), ("gemma3n", 2)]
)
# Every engine here costs 30-60 s of CI on 2 cores, so README's command (the
# CI tier) runs one case per way the mesh splits a layer kind: rotary GQA at
# 4 (more devices than KV heads; at 2, Llama is served in int8 by
# test_quantized_serving.py), routed experts, recurrent state with a hybrid
# layer, and Gemma 4's mixed head sizes with a shared K=V head, all at 2.
# The other cases are in `-m matrix` (docs/TESTING.md).
IN_CI = {("llama", 4), ("mixtral", 2), ("qwen3_5", 2), ("gemma4", 2)}
CASES = [
    pytest.param(
        case,
        marks=() if case in IN_CI else pytest.mark.matrix,
        id=f"{case[0]}-tp{case[1]}",
    )
    for case in TP_CASES
]


@pytest.fixture(
    scope="module",
    params=CASES,
)
def served(request, tmp_path_factory):
    family, tp = request.param
    model = trained(family)
    engine = serving_checks.start_engine(
        model,
        tmp_path_factory.mktemp(f"{family}_tp{tp}") / "artifact",
        tensor_parallel_size=tp,
        **family_serving.ENGINE_KWARGS.get(family, {}),
    )
    yield family, tp, model, engine
    serving_checks.shutdown(engine)


def test_greedy_matches_generate(served):
    family, _, model, engine = served
    greedy = family_serving.REFERENCE.get(
        family, reference.greedy_continuation
    )
    serving_checks.check_greedy_matches_generate(engine, model, greedy=greedy)


# Measured on gemma4_e2b: one position of the 63-token prompt (its 61st
# token) is the most sensitive to summation order on one device too: 6.9e-5
# at TP=1, 1.2e-4 at TP=2 (the same token), while the median position is
# 1.2e-7 off at TP=2 and the next largest 2.3e-5. A wrong split moves every
# position, which the median bound catches.
LOGPROB_BOUNDS = {"gemma4_e2b": {"atol": 2e-4, "median_atol": 1e-6}}


def test_prompt_logprobs_match_forward_pass(served):
    family, _, model, engine = served
    bounds = LOGPROB_BOUNDS.get(family, {"atol": 1e-4})
    serving_checks.check_prompt_logprobs(engine, model, **bounds)


def _devices_along(spec, mesh_size):
    return mesh_size ** sum(axis is not None for axis in spec)


# What the split variables' paths show (the query projection and the token
# embedding), where a family names them otherwise.
SPLIT_NAMES = {"gemma3n": ("q_proj", "embed_tokens/embedding/embeddings")}


def test_every_device_holds_its_share(served):
    """Per-device bytes are the replicated variables plus 1/N of the split
    ones, read from the arrays the engine's jitted step runs on."""
    family, tp, _, engine = served
    layout = engine.weights_layout()
    assert len(layout["devices"]) == tp
    variables = layout["variables"]
    expected = sum(
        v["bytes"] // _devices_along(v["spec"], tp) for v in variables.values()
    )
    assert layout["devices"] == [expected] * tp
    split = {p: v for p, v in variables.items() if any(v["spec"])}
    total = sum(v["bytes"] for v in variables.values())
    split_bytes = sum(v["bytes"] for v in split.values())
    # Attention, MLP (or experts) and the vocabulary are split; what stays
    # whole is norms, biases after a split matmul, position tables and, at
    # TP=4, the 2 KV heads of GQA families.
    assert split_bytes / total > 0.6, (family, tp, split_bytes / total)
    assert max(layout["devices"]) < total / tp + (total - split_bytes)
    names = " ".join(split)
    for role in SPLIT_NAMES.get(family, ("query", "embeddings")):
        assert role in names, (role, sorted(split))


def test_inspect_predicts_the_placement(served):
    """`keras-vllm inspect`'s per-device weight bytes (from the backbone
    built with shapes only) are what the engine really holds."""
    _, tp, _, engine = served
    manifest = fmt.open_artifact(engine.path, verify=False).manifest
    config = fmt.open_artifact(engine.path, verify=False).read_json(
        fmt.CONFIG_FILE
    )
    rows = capacity.per_device(
        capacity.abstract_backbone(manifest), config, manifest["dtype"], (tp,)
    )
    assert rows[0][1] == max(engine.weights_layout()["devices"])


@pytest.fixture(scope="module")
def llama_artifact(tmp_path_factory):
    return trained("llama").export_vllm(
        tmp_path_factory.mktemp("llama") / "artifact", golden_prompts=[]
    )


def test_unshardable_size_is_refused_before_vllm_starts(llama_artifact):
    import keras_vllm

    with pytest.raises(keras_vllm.ServingError) as info:
        keras_vllm.KerasVllmEngine.from_export(
            llama_artifact, tensor_parallel_size=3
        )
    message = str(info.value)
    assert "4 query heads and 2 key/value heads" in message
    assert "Sizes that work: 1, 2, 4." in message


def test_vllm_serve_refuses_an_unshardable_size(llama_artifact):
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    result = subprocess.run(
        [vllm, "serve", llama_artifact, "--tensor-parallel-size", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == refusals.EXIT_REFUSED, result.stderr[-3000:]
    assert "tensor_parallel_size=8 cannot serve" in result.stderr
    # Exit 3: refused while vLLM reads its arguments, before any engine.
    assert "Sizes that work: 1, 2, 4." in result.stderr


def test_valid_sizes_follow_tpu_inference_head_rules():
    assert tensor_parallel.valid_sizes(32, 8, up_to=64) == [1, 2, 4, 8, 16, 32]
    assert tensor_parallel.valid_sizes(8, 1, up_to=16) == [1, 2, 4, 8]
    assert tensor_parallel.valid_sizes(6, 3, up_to=8) == [1, 3, 6]


def test_cpu_device_count_is_raised_for_the_engine_process(monkeypatch):
    from keras_vllm.cpu import devices

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
    devices.request_devices(4, engine_in_this_process=False)
    flags = os.environ["XLA_FLAGS"]
    assert "--xla_cpu_max_isa=AVX2" in flags  # the user's flags are kept
    assert devices.forced_device_count(flags) == 4
    devices.request_devices(2, engine_in_this_process=False)  # never lowered
    assert devices.forced_device_count() == 4


def test_in_process_engine_with_too_few_devices_is_refused(monkeypatch):
    """This test process already runs JAX on one CPU device (it trained the
    fixtures); an in-process engine cannot get more."""
    import jax

    import keras_vllm
    from keras_vllm.cpu import devices

    jax.devices()  # JAX started here, with the session's device count
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(keras_vllm.ServingError) as info:
        devices.request_devices(
            len(jax.devices()) + 1, engine_in_this_process=True
        )
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" in str(info.value)
    assert "xla_force_host_platform_device_count" in str(info.value)


def test_keras_variables_reach_ray_workers(monkeypatch):
    from keras_vllm.serve import plugin

    name = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
    monkeypatch.setenv(name, "MY_")
    plugin._keras_variables_reach_ray_workers()
    plugin._keras_variables_reach_ray_workers()
    assert os.environ[name] == "MY_,KERAS_"


def test_placement_rules_by_layer_role():
    """The split axis of each kind of variable, on a tiny Llama and Mixtral
    built with shapes only (no family names in the rules)."""
    from flax import nnx

    from keras_vllm import testing
    from keras_vllm.serve.worker import sharding

    sizes = {role: 2 for role in ("heads", "mlp", "vocab", "experts")}
    llama = nnx.eval_shape(
        lambda: testing.backbone_class("llama")(
            **testing.backbone_config("llama"), vocabulary_size=384
        )
    )
    axes = sharding.variable_axes(llama, sizes)
    layer = "transformer_layer_0/"
    assert axes[layer + "self_attention/query/kernel"] == (1, "heads")
    assert axes[layer + "self_attention/key/kernel"] == (1, "heads")
    assert axes[layer + "self_attention/attention_output/kernel"] == (0, "heads")
    assert axes[layer + "feedforward_gate_dense/kernel"] == (1, "mlp")
    assert axes[layer + "feedforward_output_dense/kernel"] == (0, "mlp")
    assert axes["token_embedding/embeddings"] == (0, "vocab")
    assert axes["token_embedding/reverse_embeddings"] == (1, "vocab")
    assert axes[layer + "feedforward_layernorm/scale"] is None
    # 2 KV heads do not split over 4 devices: replicated (and repeated by
    # the attention).
    four = sharding.variable_axes(llama, {role: 4 for role in sizes})
    assert four[layer + "self_attention/key/kernel"] is None
    assert four[layer + "self_attention/query/kernel"] == (1, "heads")
    mixtral = nnx.eval_shape(
        lambda: testing.backbone_class("mixtral")(
            **testing.backbone_config("mixtral"), vocabulary_size=384
        )
    )
    axes = sharding.variable_axes(mixtral, sizes)
    experts = [path for path in axes if "experts/expert_" in path]
    # Along the intermediate size, like a dense MLP: `[E, hidden, I]`
    # (gate, up) over its columns, `[E, I, hidden]` (down) over its rows;
    # every device holds a slice of every expert.
    assert experts
    for path in experts:
        variable = next(v for v in mixtral.weights if v.path == path)
        want = 2 if variable.shape[1] == mixtral.hidden_dim else 1
        assert axes[path] == (want, "mlp"), (path, variable.shape)


def test_a_vocabulary_that_does_not_divide_is_refused_before_the_start():
    """tpu-inference splits the logits over the vocabulary on any TP size:
    an odd vocabulary at TP=2 failed in XLA minutes into the start."""
    from keras_vllm.errors import ServingError

    config = {"num_attention_heads": 4, "num_key_value_heads": 2}
    tensor_parallel.check_tensor_parallel({**config, "vocab_size": 512}, 2, "x")
    tensor_parallel.check_tensor_parallel({**config, "vocab_size": 511}, 1, "x")
    with pytest.raises(ServingError, match="vocabulary has 511 tokens"):
        tensor_parallel.check_tensor_parallel(
            {**config, "vocab_size": 511}, 2, "x"
        )


def test_inspect_lists_as_fine_only_what_serving_accepts(llama_artifact):
    """`keras-vllm inspect`'s per-device table and the serving check agree,
    the vocabulary included: an odd vocabulary is refused at TP > 1."""
    from keras_vllm.cli import inspect_artifact
    from keras_vllm.errors import ServingError

    opened = fmt.open_artifact(llama_artifact, verify=False)
    manifest, config = opened.manifest, opened.read_json(fmt.CONFIG_FILE)
    backbone = capacity.abstract_backbone(manifest)
    for vocabulary in (config["vocab_size"], 511):
        edited = {**config, "vocab_size": vocabulary}
        for size, weights, _ in capacity.per_device(
            backbone, edited, manifest["dtype"]
        ):
            try:
                tensor_parallel.check_tensor_parallel(edited, size, "x")
                served = True
            except ServingError:
                served = False
            assert (weights is not None) == served, (vocabulary, size)
    rows = capacity.per_device(
        backbone, {**config, "vocab_size": 511}, manifest["dtype"], (1, 2)
    )
    assert rows[0][1] is not None and rows[1][1] is None
    lines = inspect_artifact.tensor_parallel_lines(
        fmt.open_artifact(llama_artifact, verify=False)
    )
    assert any("(refused: attention heads do not split over 8)" in line
               for line in lines), lines
