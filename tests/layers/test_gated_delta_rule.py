"""Which fused conv1d + gated delta rule kernel a linear-attention layer runs.

tpu-inference's GDN v3 Pallas kernel splits heads into the chip's 128-lane
columns, so a layer whose heads are narrower (the tiny Qwen 3.5 fixtures:
16) crashed inside it on a TPU (`ValueError: Need at least one array to
concatenate`). `gated_delta_rule.kernel_for` sends such layers to the
portable JAX kernel and keeps the Pallas one for the shapes it takes (every
Qwen 3.5 preset: 128). The TPU tier runs both shapes on the chip
(`tests/tpu/test_tpu_families.py`); here the choice itself, with the
backend faked. Cost: < 1 s.
"""

import logging

import jax
import pytest

from keras_vllm.layers.common import gated_delta_rule


@pytest.fixture
def on_a_tpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(gated_delta_rule, "_tpu_lanes", lambda: 128)
    monkeypatch.setattr(gated_delta_rule, "_warned", set())


@pytest.mark.parametrize(
    "key_head_dim, value_head_dim", [(128, 128), (256, 128), (128, 256)]
)
def test_the_pallas_kernel_runs_the_head_sizes_it_takes(
    on_a_tpu, key_head_dim, value_head_dim
):
    assert gated_delta_rule.kernel_for(key_head_dim, value_head_dim) is None


@pytest.mark.parametrize(
    "key_head_dim, value_head_dim", [(16, 16), (64, 128), (128, 96), (192, 128)]
)
def test_other_head_sizes_run_the_portable_kernel_on_a_tpu(
    on_a_tpu, caplog, key_head_dim, value_head_dim
):
    with caplog.at_level(logging.WARNING, logger="keras_vllm"):
        kernel = gated_delta_rule.kernel_for(key_head_dim, value_head_dim)
        again = gated_delta_rule.kernel_for(key_head_dim, value_head_dim)
    assert kernel is again is gated_delta_rule.conv1d_gdn
    # Said once per head shape, naming the sizes and the reason.
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert f"{key_head_dim} (key) and {value_head_dim} (value)" in messages[0]
    assert "multiples of 128" in messages[0]


def test_cpu_devices_run_the_portable_kernel():
    assert jax.default_backend() == "cpu"
    for dims in [(16, 16), (128, 128)]:
        assert gated_delta_rule.kernel_for(*dims) is gated_delta_rule.conv1d_gdn
