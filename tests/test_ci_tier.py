"""README's test command (the CI tier) still checks every served family and
every feature listed here; the `matrix` marker only moves repeats out.

When the whole suite runs (README's command), the items of this session are
the CI tier; otherwise (one file, `-k`, `-m`) it is collected in a
subprocess (about a minute: every test module is imported). Costs nothing
in CI beyond the look-up.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from keras_vllm import testing

# The tiers are what the serving modules collect: without the serving extra
# they collect nothing to check.
pytestmark = pytest.mark.serving

TESTS = pathlib.Path(__file__).parent

# Each family's engine checks (`helpers/family_serving.py`).
FAMILY_MODULES = (
    "tests/serve/test_serving_families.py",
    "tests/serve/test_serving_more_families.py",
)
FAMILY_CHECKS = (
    "test_greedy_matches_generate",
    "test_prompt_logprobs_match_forward_pass",
)

# Feature -> node id prefixes; the CI tier must hold a test under at least
# one prefix of each (a parametrized id in brackets narrows it to a case).
FEATURES = {
    "tensor parallelism (TP=2)": [
        "tests/serve/test_tensor_parallel.py::test_greedy_matches_generate[gemma4-tp2]",
    ],
    "tensor parallelism, more devices than KV heads (TP=4)": [
        "tests/serve/test_tensor_parallel.py::test_greedy_matches_generate[llama-tp4]",
    ],
    "data parallelism": ["tests/serve/test_data_parallel.py::"],
    "LoRA adapter artifacts": ["tests/serve/test_lora_adapters.py::"],
    "many LoRA adapters on one engine": ["tests/serve/test_multi_adapter.py::"],
    "LoRA on routed experts": ["tests/serve/test_moe_lora_serving.py::"],
    "int8": ["tests/serve/test_quantized_serving.py::test_greedy_matches_quantized_generate[llama-int8"],
    "int8 at TP=2": ["tests/serve/test_quantized_serving.py::test_greedy_matches_quantized_generate[llama-int8-tp2]"],
    "int4": ["tests/serve/test_quantized_serving.py::test_greedy_matches_quantized_generate[gpt2-int4]"],
    "GPTQ": ["tests/serve/test_quantized_serving.py::test_greedy_matches_quantized_generate[gpt2-gptq]"],
    "int8 routed experts": ["tests/serve/test_quantized_serving.py::test_greedy_matches_quantized_generate[mixtral-int8]"],
    "int8 hybrid (recurrent state)": ["tests/serve/test_quantized_serving.py::test_greedy_matches_quantized_generate[qwen3_5-int8]"],
    "live weight updates": ["tests/serve/test_weight_updates.py::"],
    "MTP speculation (Gemma 4 assistant)": [
        "tests/serve/test_mtp_speculation.py::",
    ],
    "reload over HTTP": ["tests/serve/test_reload_endpoint.py::"],
    "images": ["tests/serve/test_serving_images.py::"],
    "images over HTTP": ["tests/serve/test_serving_images_http.py::"],
    "images at TP=2": ["tests/serve/test_tensor_parallel_images.py::"],
    "hybrid attention + recurrent state at TP=2": [
        "tests/serve/test_tensor_parallel.py::test_greedy_matches_generate[qwen3_5-tp2]",
    ],
    "routed experts": ["tests/layers/test_routed_experts.py::"],
    "routed experts at TP=2": [
        "tests/serve/test_tensor_parallel.py::test_greedy_matches_generate[mixtral-tp2]",
    ],
    "Hugging Face origin (export)": ["tests/export/test_hf_presets.py::"],
    "Hugging Face origin (served)": ["tests/serve/test_hf_presets_serving.py::"],
    "signing": ["tests/signing/test_signing.py::"],
    "hostile artifacts": ["tests/format/test_hostile_artifacts.py::"],
    "hostile requests to a server": ["tests/serve/test_hardened_server.py::"],
    "hostile worker inputs": ["tests/serve/test_hardened_worker.py::"],
    "command line": ["tests/cli/test_cli.py::"],
    "command line with an engine": ["tests/cli/test_cli_engine.py::"],
    "plain vllm serve": ["tests/serve/test_vllm_serve.py::"],
    "vllm serve refusals": ["tests/serve/test_vllm_serve_refusals.py::"],
    "multi-host Ray": ["tests/serve/test_multihost_ray.py::"],
    "structured outputs": ["tests/serve/test_structured_outputs.py::"],
    "prefix caching policy": ["tests/serve/test_prefix_caching_policy.py::"],
    "KV cache pressure, preemption": ["tests/serve/test_kv_pressure.py::"],
    "warm restarts (compile cache)": ["tests/serve/test_compile_cache.py::"],
    "entry points (script, notebook)": ["tests/serve/test_entry_points.py::"],
    "crash-safe export": ["tests/export/test_crash_safe_export.py::"],
    "export without vLLM installed": ["tests/export/test_export_without_vllm.py::"],
    "speculative decoding (n-gram), exact on every family engine": [
        "tests/serve/test_serving_families.py::test_greedy_matches_generate",
    ],
    "speculative decoding refusals": ["tests/serve/test_speculation.py::"],
    "speculative decoding through recurrent state, drafts accepted": [
        "tests/serve/test_hybrid_speculation.py::",
    ],
    "Hugging Face origin equal to transformers": [
        "tests/export/test_hf_transformers_parity.py::",
    ],
    "Gemma 3n's encoders exported, refused as inputs": [
        "tests/layers/test_gemma3n.py::",
    ],
}


def _whole_suite(config):
    """Whether this session collected README's test command's items."""
    if config.option.markexpr or config.option.keyword:
        return False
    args = [pathlib.Path(a.split("::")[0]).resolve() for a in config.args]
    return bool(args) and all(
        a in (TESTS.resolve(), TESTS.resolve().parent) for a in args
    )


def _ci_tier_ids(request):
    if _whole_suite(request.config):
        return [item.nodeid for item in request.session.items]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q",
         "-p", "no:cacheprovider", "tests"],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTEST_ADDOPTS": ""},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def ci_tier(request):
    return _ci_tier_ids(request)


def test_every_served_family_has_engine_checks_in_the_ci_tier(ci_tier):
    missing = []
    for family in testing.FAMILIES:
        for check in FAMILY_CHECKS:
            if not any(
                nodeid.startswith(f"{module}::{check}[{family}]")
                for nodeid in ci_tier
                for module in FAMILY_MODULES
            ):
                missing.append(f"{check}[{family}]")
    assert not missing, missing


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_every_listed_feature_has_a_check_in_the_ci_tier(ci_tier, feature):
    prefixes = FEATURES[feature]
    assert any(
        nodeid.startswith(prefix) for nodeid in ci_tier for prefix in prefixes
    ), f"{feature}: no CI-tier test under {prefixes}"
