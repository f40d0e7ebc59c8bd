"""Every served family on vLLM (CPU backend) equals KerasHub, token for token.

One engine per family (vLLM's default multiprocess mode and scheduling,
sized to the checks by `helpers.engine_shapes`), torn down before the next
family starts. The families are split between this module and
`test_serving_more_families.py` (see `helpers/family_serving.py`).
"""

import pytest

pytest.importorskip("tpu_inference")

from helpers import family_serving  # noqa: E402
from helpers.family_serving import (  # noqa: E402, F401
    in_matrix,
    test_default_sampling_follows_exported_sampler,
    test_engine_allocates_each_layers_cache,
    test_golden_outputs_replay_on_the_engine,
    test_greedy_matches_generate,
    test_ids_only_an_unserved_encoder_embeds_are_refused,
    test_images_and_audio_are_refused_by_name,
    test_prompt_logprobs_match_forward_pass,
    test_speculation_is_refused_where_it_would_change_output,
)
from keras_vllm import testing  # noqa: E402

FAMILIES = family_serving.ALL_FAMILIES[: len(family_serving.ALL_FAMILIES) // 2]
served = family_serving.served_fixture(FAMILIES)


def test_every_family_is_served():
    from test_serving_more_families import FAMILIES as MORE

    assert set(FAMILIES) | set(MORE) == set(testing.FAMILIES)
    assert not set(FAMILIES) & set(MORE)
