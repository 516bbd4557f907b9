"""Real vLLM (CPU build) against real transformers, through the service, on real models.

One ParityService per module keeps the workers warm: a test that changes a load-time setting
(model, dtype) pays one engine start (~10-20 s on 2 cores); the others reuse it.
"""
from __future__ import annotations

import os
import signal

import pytest

from parity_ui.config import build_config
from parity_ui.prompts import PromptSpec
from parity_ui.service import RunRequest
from parity_ui.store import get_run
from tiny_models import build_model

pytestmark = pytest.mark.engines

CODE_PROMPT = "def parse_args(self, args=None, namespace=None):"
CHAT_PROMPT = "Give me a brief explanation of gravity in simple terms."


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_llama):
    return {"llama": tiny_llama, "qwen2": build_model(tmp_path_factory.mktemp("models") / "qwen2", "qwen2", seed=1)}


def _run(service, model, prompts, *overrides, on_event=None):
    cfg = build_config(None, list(overrides))
    specs = [p if isinstance(p, PromptSpec) else PromptSpec(text=p) for p in prompts]
    return service.run(RunRequest(model=str(model), prompts=specs, config=cfg), on_event=on_event)


def _first_mismatch(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_models_are_identical_in_float32(service, models, arch):
    run = _run(service, models[arch], [CODE_PROMPT], "dtype=float32", "max_new_tokens=64", "ignore_eos=true")
    assert run.status == "ok", run.error
    p = run.prompts[0]
    assert len(p.vllm.token_ids) == len(p.hf.token_ids) == 64
    assert p.vllm.token_ids == p.hf.token_ids
    assert p.comparison.identical and p.comparison.first_divergence is None
    assert p.comparison.max_abs_gap < 1e-3  # float32 on the same CPU: rounding-level gaps only
    assert all(s.logprob is not None and s.top for s in p.vllm.steps + p.hf.steps)
    stored = get_run(service.db, run.id)
    assert stored.prompts[0].vllm.token_ids == p.vllm.token_ids and stored.status == "ok"


def test_bfloat16_divergence_is_reported_with_its_index(service, models):
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=bfloat16", "max_new_tokens=64", "ignore_eos=true")
    assert run.status == "diverged", run.error
    p = run.prompts[0]
    index = _first_mismatch(p.vllm.token_ids, p.hf.token_ids)
    assert index is not None
    assert p.comparison.first_divergence == index == run.first_divergence
    d = p.comparison.divergence
    assert (d.vllm_token_id, d.hf_token_id) == (p.vllm.token_ids[index], p.hf.token_ids[index])
    assert len(p.comparison.logprob_gaps) == index  # gaps only over the shared prefix


def test_stop_token_ids_stop_both_engines_at_the_same_place(service, models):
    free = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=32", "ignore_eos=true")
    stop_id = free.prompts[0].vllm.token_ids[5]
    first = free.prompts[0].vllm.token_ids.index(stop_id)
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=32",
               f"stop_token_ids=[{stop_id}]")
    p = run.prompts[0]
    assert run.status == "ok", run.error
    assert p.vllm.token_ids == p.hf.token_ids == free.prompts[0].vllm.token_ids[: first + 1]
    assert p.vllm.finish_reason == p.hf.finish_reason == "stop"


def test_a_batch_of_prompts_runs_in_chunks_and_each_is_compared(service, models):
    prompts = [CODE_PROMPT, "class Namespace(object):", PromptSpec(messages=[{"role": "user", "content": "hi"}])]
    run = _run(service, models["llama"], prompts, "dtype=float32", "max_new_tokens=16", "ignore_eos=true",
               "batch_size=2")
    assert run.status == "ok", run.error
    assert [p.index for p in run.prompts] == [0, 1, 2]
    assert all(p.comparison.identical and len(p.vllm.token_ids) == 16 for p in run.prompts)
    assert len({tuple(p.prompt_token_ids) for p in run.prompts}) == 3


def test_tokens_stream_live_and_match_the_final_streams(service, models):
    seen = {"vllm": [], "hf": []}

    def on_event(e):
        if e.kind == "token":
            seen[e.engine].append(e.step.token_id)

    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=24", "ignore_eos=true",
               on_event=on_event)
    assert seen["vllm"] == run.prompts[0].vllm.token_ids
    assert seen["hf"] == run.prompts[0].hf.token_ids


def test_stop_cancels_cleanly_and_the_next_run_works(service, models):
    count = {"n": 0}

    def on_event(e):
        if e.kind == "token" and e.engine == "vllm":
            count["n"] += 1
            if count["n"] == 3:
                service.cancel()

    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=200", "ignore_eos=true",
               on_event=on_event)
    assert run.status == "cancelled"
    assert 3 <= len(run.prompts[0].vllm.steps) < 200  # what was made before the stop is kept
    assert get_run(service.db, run.id).status == "cancelled"
    again = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=8", "ignore_eos=true")
    assert again.status == "ok", again.error


def test_a_crashed_worker_becomes_an_error_run_and_a_new_worker_serves_the_next(service, models):
    def on_event(e):
        if e.kind == "token" and e.engine == "hf" and e.step.position == 2:
            os.kill(service.pool.workers["hf"]._proc.pid, signal.SIGKILL)  # as the OOM killer would

    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=400", "ignore_eos=true",
               on_event=on_event)
    assert run.status == "error"
    assert "hf engine process exited with code -9" in run.error and "out of memory" in run.error
    assert run.prompts[0].vllm.token_ids  # vLLM's finished stream is kept
    assert run.prompts[0].hf.error and len(run.prompts[0].hf.steps) >= 3  # and HF's partial one
    assert get_run(service.db, run.id).status == "error"
    again = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=8", "ignore_eos=true")
    assert again.status == "ok", again.error


def test_demo_model_float32_is_identical_for_64_tokens(service):
    run = _run(service, "demo", [CHAT_PROMPT], "dtype=float32", "chat=true", "max_new_tokens=64", "ignore_eos=true")
    assert run.status == "ok", run.error
    p = run.prompts[0]
    assert len(p.vllm.token_ids) == 64 and p.vllm.token_ids == p.hf.token_ids
    assert p.prompt_token_ids.count(1) == p.prompt_text.count("<|im_start|>")  # no second BOS


def test_demo_model_bfloat16_diverges_and_the_index_is_reported(service):
    run = _run(service, "demo", [CHAT_PROMPT], "dtype=bfloat16", "chat=true", "max_new_tokens=64",
               "ignore_eos=true")
    assert run.status == "diverged", run.error
    p = run.prompts[0]
    assert p.comparison.first_divergence == _first_mismatch(p.vllm.token_ids, p.hf.token_ids)
    assert run.engines["vllm"].dtype == run.engines["hf"].dtype == "bfloat16"
