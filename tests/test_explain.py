"""explain_prompt on hand-built engine results (pure code above the engines: no engine runs here)."""
from __future__ import annotations

import pytest

from parity_ui.compare import compare_streams
from parity_ui.config import build_config
from parity_ui.explain import MASKED_LOGPROB, NEAR_TIE_NATS, NOISE_MULTIPLE, explain_prompt
from parity_ui.types import EngineResult, PromptResult, TokenStep, TopLogprob

GREEDY = build_config()


def step(pos: int, tid: int, top: list[tuple[int, float]]) -> TokenStep:
    lp = dict(top).get(tid, -9.0)
    return TokenStep(position=pos, token_id=tid, text=f"<{tid}>", logprob=lp, rank=1,
                     top=[TopLogprob(t, v, f"<{t}>") for t, v in top])


def result(engine: str, steps: list[TokenStep], finish: str = "length") -> EngineResult:
    return EngineResult(engine=engine, prompt_index=0, token_ids=[s.token_id for s in steps], steps=steps,
                        finish_reason=finish)


def prompt(vllm: list[TokenStep], hf: list[TokenStep], vfinish: str = "length", hfinish: str = "length") -> PromptResult:
    v, h = result("vllm", vllm, vfinish), result("hf", hf, hfinish)
    return PromptResult(index=0, prompt_text="p", prompt_token_ids=[1, 2], vllm=v, hf=h,
                        comparison=compare_streams(v, h))


def shared(n: int, gap: float = 0.0) -> tuple[list[TokenStep], list[TokenStep]]:
    """n positions where both engines choose token 10+i, with a logprob gap of `gap`."""
    a = [step(i, 10 + i, [(10 + i, -0.1), (99, -3.0)]) for i in range(n)]
    b = [step(i, 10 + i, [(10 + i, -0.1 - gap), (99, -3.0)]) for i in range(n)]
    return a, b


def test_identical_streams_are_identical():
    a, b = shared(4, gap=0.01)
    out = explain_prompt(prompt(a, b), GREEDY)
    assert out["verdict"] == "identical"
    assert out["noise_before"] == pytest.approx(0.01)
    assert "4 tokens" in out["summary"]


def test_near_tie_is_numerical():
    a, b = shared(3)
    m = NEAR_TIE_NATS / 2
    a.append(step(3, 50, [(50, -0.70), (51, -0.70 - m)]))
    b.append(step(3, 51, [(51, -0.69), (50, -0.69 - m / 2)]))
    out = explain_prompt(prompt(a, b), GREEDY)
    assert out["verdict"] == "numerical near-tie"
    assert out["index"] == 3
    assert out["vllm"]["margin_over_other"] == pytest.approx(m)
    assert out["hf"]["margin_over_other"] == pytest.approx(m / 2)
    assert out["vllm"]["other_token_rank"] == 2 and out["hf"]["other_token_rank"] == 2
    assert out["vllm"]["top12_margin"] == pytest.approx(m)
    assert out["accepted_by_vllm_rule"] is True
    assert "near-tie" in out["summary"] and "<50>" in out["summary"]


def test_large_margin_is_a_real_disagreement():
    a, b = shared(2)
    a.append(step(2, 50, [(50, -0.1), (51, -3.0)]))
    b.append(step(2, 51, [(51, -0.1), (50, -2.5)]))
    out = explain_prompt(prompt(a, b), GREEDY)
    assert out["verdict"] == "real disagreement"
    assert out["largest_margin"] == pytest.approx(2.9)
    assert out["largest_margin"] > out["tie_bound"]


def test_other_token_outside_topk_is_a_real_disagreement_even_with_small_top_margin():
    a, b = shared(1)
    a.append(step(1, 50, [(50, -0.70), (52, -0.75)]))
    b.append(step(1, 51, [(51, -0.70), (53, -0.75)]))
    out = explain_prompt(prompt(a, b), GREEDY)
    assert out["vllm"]["other_token_rank"] is None
    assert out["accepted_by_vllm_rule"] is False
    assert out["verdict"] == "real disagreement"
    assert "outside the other's top-k" in out["summary"]


def test_noise_widens_the_near_tie_bound():
    gap = NEAR_TIE_NATS  # the engines already differ by this much on shared context
    a, b = shared(3, gap=gap)
    m = NEAR_TIE_NATS * 1.5  # above the fixed bound, below NOISE_MULTIPLE * noise
    a.append(step(3, 50, [(50, -0.5), (51, -0.5 - m)]))
    b.append(step(3, 51, [(51, -0.5), (50, -0.5 - m)]))
    out = explain_prompt(prompt(a, b), GREEDY)
    assert out["tie_bound"] == pytest.approx(NOISE_MULTIPLE * gap)
    assert out["verdict"] == "numerical near-tie"


def test_masked_token_is_named():
    a, b = shared(2)
    a.append(step(2, 2, [(2, -0.2), (60, -1.9)]))  # vLLM picks EOS (id 2)
    b.append(step(2, 60, [(60, -0.3), (2, -1e30)]))  # HF's processors forbade it
    out = explain_prompt(prompt(a, b), GREEDY)
    assert out["hf"]["other_token_logprob"] <= MASKED_LOGPROB
    assert out["verdict"] == "masked token"
    assert "HF" in out["summary"]


def test_one_engine_stopping_on_eos_is_length():
    a, b = shared(3)
    a[-1] = step(2, 2, [(2, -0.1), (99, -3.0)])
    b[-1] = step(2, 2, [(2, -0.1), (99, -3.0)])
    b.append(step(3, 40, [(40, -0.2), (99, -3.0)]))
    out = explain_prompt(prompt(a, b, vfinish="stop"), GREEDY)
    assert out["verdict"] == "length"
    assert out["stopped_engine"] == "vllm" and out["stopped_after"] == 3 and out["continued_to"] == 4
    assert out["stop_token_id"] == 2
    assert "stop id only for vLLM" in out["summary"]


def test_sampled_runs_are_expected_to_differ():
    a, b = shared(1)
    a.append(step(1, 50, [(50, -0.1), (51, -3.0)]))
    b.append(step(1, 51, [(51, -0.1), (50, -3.0)]))
    out = explain_prompt(prompt(a, b), build_config(overrides=["temperature=0.8"]))
    assert out["verdict"] == "sampling"


def test_engine_error_and_missing_comparison():
    a, b = shared(3)
    pr = prompt(a, b[:1])
    pr.hf.error = "boom"
    out = explain_prompt(pr, GREEDY)
    assert out["verdict"] == "error" and "boom" in out["summary"]
    empty = PromptResult(index=0, prompt_text="p", prompt_token_ids=[1])
    assert explain_prompt(empty, GREEDY)["verdict"] == "error"
