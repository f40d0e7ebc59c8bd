"""The keras-hub modules keras-vllm fixes as soon as they are imported.

Some keras-hub layers cannot be used under keras-vllm as released (they
break under NNX, or give two variables one path), some compute other than
the checkpoints they were converted from (Qwen3's query/key norms), and
some Hugging Face converters misread checkpoints transformers writes
(tests/export/test_hf_transformers_parity.py compares every converted
family with transformers). Their fixes must be in
place before a model is built, so they are installed right after keras-hub
imports the module that defines the layers
(`keras_vllm.export.keras_hub_hooks`), not when a family's paged subclass
is registered. Each fix lives with its family; this table lists them.

Importing this module imports neither keras nor keras-hub.
"""

from keras_vllm.layers import gemma3n_fixes
from keras_vllm.layers import gemma4_hf_fixes
from keras_vllm.layers import gpt_oss_hf_fixes
from keras_vllm.layers import llama_fixes
from keras_vllm.layers import mistral_hf_fixes
from keras_vllm.layers import qwen3_fixes
from keras_vllm.layers import smollm3_fixes

# keras-hub module name -> function that fixes that (imported) module.
FIXES = {
    smollm3_fixes.KERAS_HUB_MODULE: smollm3_fixes.install,
    gemma3n_fixes.KERAS_HUB_MODULE: gemma3n_fixes.install,
    gemma4_hf_fixes.KERAS_HUB_MODULE: gemma4_hf_fixes.install,
    gpt_oss_hf_fixes.KERAS_HUB_MODULE: gpt_oss_hf_fixes.install,
    gpt_oss_hf_fixes.BACKBONE_MODULE: gpt_oss_hf_fixes.install_backbone,
    llama_fixes.KERAS_HUB_MODULE: llama_fixes.install,
    mistral_hf_fixes.KERAS_HUB_MODULE: mistral_hf_fixes.install,
    qwen3_fixes.KERAS_HUB_MODULE: qwen3_fixes.install,
}
