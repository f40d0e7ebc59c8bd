"""The second half of the served families (see `test_serving_families.py`)."""

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

FAMILIES = family_serving.ALL_FAMILIES[len(family_serving.ALL_FAMILIES) // 2 :]
served = family_serving.served_fixture(FAMILIES)
