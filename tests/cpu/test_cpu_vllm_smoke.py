"""End-to-end smoke check of the CPU backend with vLLM's own native model.

Builds a tiny random HF Llama locally (no hub access), starts a real
`vllm.LLM` engine on JAX CPU devices in a subprocess, and checks its greedy
tokens against HF transformers. The plugin wiring is the real one: a
temporary `*.dist-info` on `PYTHONPATH` declares the `vllm.platform_plugins`
and `vllm.general_plugins` entry points (pointing at
`keras_vllm.cpu.detect.platform_class_path` and `keras_vllm.cpu.apply_patches`),
and vLLM runs its default multiprocess engine (the EngineCore is forked).

Slow (about a minute on 2 cores); run with `pytest -m slow`.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import types

import pytest

from keras_vllm.cpu import kv_capacity

pytest.importorskip("tpu_inference")
pytestmark = [pytest.mark.serving, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = [[5, 17, 200, 31], [7, 300, 12, 99, 4, 250, 8], [42]]
MAX_TOKENS = 8


def _make_tiny_llama(path, head_dim):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import trainers
    from transformers import (LlamaConfig, LlamaForCausalLM,
                              PreTrainedTokenizerFast)

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["a tiny corpus for a tiny tokenizer"] * 20,
                                  trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>",
                            eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)
    config = LlamaConfig(vocab_size=512, hidden_size=4 * head_dim,
                         intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         head_dim=head_dim, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    expected = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=MAX_TOKENS,
                                 do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
            expected.append(out[0, len(prompt):].tolist())
    return expected


def _write_plugin_dist(site):
    dist = site / "keras_vllm_cpu_smoke-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: keras-vllm-cpu-smoke\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent("""\
            [vllm.platform_plugins]
            keras_vllm_cpu = keras_vllm.cpu.detect:platform_class_path

            [vllm.general_plugins]
            keras_vllm = keras_vllm.cpu:apply_patches
            """))


ENGINE_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], max_model_len=128, max_num_seqs=4,
              max_num_batched_tokens=128, dtype="float32",
              gpu_memory_utilization=0.5, seed=0)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in json.loads(sys.argv[2])]
    outs = llm.generate(prompts, SamplingParams(max_tokens=int(sys.argv[3]),
                                                temperature=0.0,
                                                ignore_eos=True))
    print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
    # One sequence alone: its decode steps take the CPU's 1-token bucket.
    solo = llm.generate(prompts[-1:], SamplingParams(
        max_tokens=int(sys.argv[3]), temperature=0.0, ignore_eos=True))
    print("SOLO " + json.dumps(list(solo[0].outputs[0].token_ids)))
    print("BUCKETS " + json.dumps(
        llm.llm_engine.vllm_config.additional_config.get("compilation_sizes")))
    print("ASYNC " + str(llm.llm_engine.vllm_config.scheduler_config.async_scheduling))
    cache = llm.llm_engine.vllm_config.cache_config
    print("BLOCKS " + json.dumps([cache.num_gpu_blocks, cache.block_size]))
"""


# One head size (a real model's; keras-vllm's own engine tests use 16).
@pytest.mark.parametrize("head_dim", [64])
def test_vllm_native_llama_on_cpu_matches_transformers(tmp_path, head_dim):
    model_dir = tmp_path / "tiny-llama"
    expected = _make_tiny_llama(model_dir, head_dim)
    site = tmp_path / "site"
    _write_plugin_dist(site)
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)  # the platform plugin must set it
    env.update(
        PYTHONPATH=os.pathsep.join(
            [str(site), str(REPO)] +
            [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
        KERAS_VLLM_DEVICE="cpu",
        KERAS_VLLM_CPU_MEMORY_GB="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    proc = subprocess.run(
        [sys.executable, "-c", ENGINE_SCRIPT, str(model_dir),
         json.dumps(PROMPTS), str(MAX_TOKENS)],
        env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    result = next(line for line in proc.stdout.splitlines()
                  if line.startswith("RESULT "))
    assert json.loads(result[len("RESULT "):]) == expected, log[-6000:]
    solo = next(line for line in proc.stdout.splitlines()
                if line.startswith("SOLO "))
    assert json.loads(solo[len("SOLO "):]) == expected[-1], log[-6000:]
    assert "BUCKETS [1]" in proc.stdout
    # vLLM keeps its default async scheduling on the CPU backend, and the
    # greedy tokens above are exact with it.
    assert "ASYNC True" in proc.stdout
    assert "serving with tpu-inference on JAX CPU devices" in log
    # The KV cache holds the engine's 4 sequences of 128 tokens, not the
    # 0.5 GiB its memory budget would allow (hundreds of blocks).
    blocks, block_size = json.loads(next(
        line for line in proc.stdout.splitlines() if line.startswith("BLOCKS ")
    )[len("BLOCKS "):])
    assert blocks == kv_capacity.blocks_needed(4, 128, block_size), log[-3000:]


class _Config:
    def __init__(self, additional_config):
        self.additional_config = additional_config


def test_cpu_engines_get_a_one_token_bucket(monkeypatch):
    from keras_vllm.cpu import buckets

    monkeypatch.delenv("MIN_TOKEN_BUCKET", raising=False)
    config = _Config({})
    assert buckets.add_one_token_bucket(config)
    assert config.additional_config == {"compilation_sizes": [1]}
    # The user's own buckets are left as given.
    config = _Config({"compilation_sizes": [24]})
    assert not buckets.add_one_token_bucket(config)
    assert config.additional_config == {"compilation_sizes": [24]}
    # Data parallelism: one token per replica (tpu-inference's buckets
    # count every replica's tokens).
    config = _Config({})
    config.sharding_config = types.SimpleNamespace(total_dp_size=2)
    assert buckets.add_one_token_bucket(config)
    assert config.additional_config == {"compilation_sizes": [2]}
    monkeypatch.setenv("MIN_TOKEN_BUCKET", "8")
    config = _Config({})
    assert not buckets.add_one_token_bucket(config)
    assert config.additional_config == {}
    # Speculating: a lone sequence's verify step (1 + 4 drafts) too.
    monkeypatch.delenv("MIN_TOKEN_BUCKET")
    config = _Config({})
    config.speculative_config = types.SimpleNamespace(num_speculative_tokens=4)
    assert buckets.add_one_token_bucket(config)
    assert config.additional_config == {"compilation_sizes": [1, 5]}
