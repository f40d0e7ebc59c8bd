"""The whole handoff in one process, started the ways users start it.

A plain top-level script (no `if __name__ == "__main__":` guard) and the
same code under `python -c` each fine-tune a tiny model, export it, start
the real engine (vLLM's default multiprocess mode and async scheduling)
and generate: the served tokens must equal `generate()`'s, and the script
body must run exactly once (a process start that re-ran the user's script
would run it again, or die in multiprocessing's bootstrapping check).
Pytest is the third entry point: every engine test of this suite runs in
a pytest worker where JAX already runs.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

_HANDOFF = textwrap.dedent(
    """
    import sys
    import keras_vllm
    from keras_vllm import reference, testing
    from vllm import SamplingParams

    print("SCRIPT BODY RAN", flush=True)
    causal_lm = testing.build_tiny_causal_lm("gpt2")
    testing.fine_tune(causal_lm, steps=20)
    path = causal_lm.export_vllm(sys.argv[1], golden_prompts=[])
    prompts = testing.prompts()[:4]
    ids = [reference.prompt_token_ids(causal_lm, p) for p in prompts]
    want = reference.greedy_batch(causal_lm, ids, 12, [])
    engine = keras_vllm.KerasVllmEngine.from_export(
        path, max_num_seqs=8, max_num_batched_tokens=128
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = [list(o.outputs[0].token_ids) for o in engine.generate(prompts, params)]
    engine.shutdown()
    assert len({tuple(w) for w in want}) > 1, want
    print("EXACT" if got == want else f"MISMATCH {got} != {want}", flush=True)
    """
)


def _environment():
    # A user's fresh shell: nothing an earlier engine of this test worker
    # set in its environment.
    drop = ("VLLM_WORKER_MULTIPROC_METHOD", "KERAS_VLLM_ENGINE_START")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.parametrize("entry", ["unguarded script", "python -c"])
def test_one_process_handoff_serves_exactly(entry, tmp_path):
    if entry == "python -c":
        argv = [sys.executable, "-c", _HANDOFF]
    else:
        script = tmp_path / "handoff.py"
        script.write_text(_HANDOFF)
        argv = [sys.executable, str(script)]
    result = subprocess.run(
        argv + [str(tmp_path / "artifact")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env=_environment(),
    )
    out = result.stdout
    assert result.returncode == 0, out[-2000:] + result.stderr[-5000:]
    assert out.count("SCRIPT BODY RAN") == 1, out
    assert "EXACT" in out, out[-2000:]
    assert "bootstrapping phase" not in result.stderr
