"""Shared-seed sampling with real engines (issue 31): at T=1 in float32, HF and vLLM draw the same
tokens for 20 prompts x 64 tokens; the same seed gives the same streams again, another seed others;
every sampled token carries its draw (margin, kept set, kept mass)."""
from __future__ import annotations

import pytest

from parity_ui.core.config import build_config
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.prepare import RunRequest

WORDS = ["parse", "the", "path", "class", "import", "value", "return", "list", "json", "format"]
PROMPTS = [f"def {WORDS[i % 10]}_{WORDS[(3 * i + 1) % 10]}(self, {WORDS[(7 * i + 2) % 10]}):" for i in range(20)]


def _run(service, model, prompts, *overrides, sides=None):
    cfg = build_config(None, ["dtype=float32", "ignore_eos=true", "sampling=shared-seed", "temperature=1",
                              *overrides], sides=sides)
    return service.run(RunRequest(model=str(model), prompts=[PromptSpec(text=p) for p in prompts], config=cfg))


def test_shared_seed_sampling_is_identical_on_hf_and_vllm_in_float32(service, tiny_llama):
    run = _run(service, tiny_llama, PROMPTS, "max_new_tokens=64", "batch_size=20")
    assert run.status == "ok", run.error
    streams = {}
    for p in run.prompts:
        hf, vllm = p.results["hf"], p.results["vllm"]
        assert len(hf.token_ids) == len(vllm.token_ids) == 64
        assert hf.token_ids == vllm.token_ids, p.index
        (c,) = p.comparisons
        assert c.identical and c.max_abs_gap < 1e-3
        for side in (hf, vllm):
            assert all(s.margin is not None and s.margin > 0 and s.kept == 1024 for s in side.steps)
            assert all(s.kept_mass == pytest.approx(1.0) for s in side.steps)  # nothing cut at top_p=1
            # T=1 with every token kept: the processed logprob is the raw one.
            assert all(s.processed_logprob == pytest.approx(s.logprob, abs=1e-4) for s in side.steps)
        streams[p.index] = hf.token_ids
    # A sampled stream, not greedy: some token is not the side's own argmax.
    assert any(s.rank != 1 for p in run.prompts for s in p.results["hf"].steps)
    # Stored and read back with its draws.
    stored = service.store.get_run(run.id)
    back = stored.prompts[0].results["vllm"].steps
    assert [s.margin for s in back] == [s.margin for s in run.prompts[0].results["vllm"].steps]

    # The same seed: the same streams (a smaller run); another seed: other streams.
    again = _run(service, tiny_llama, PROMPTS[:4], "max_new_tokens=64", "batch_size=4")
    assert again.status == "ok", again.error
    assert [p.results["vllm"].token_ids for p in again.prompts] == [streams[i] for i in range(4)]
    assert [p.results["hf"].token_ids for p in again.prompts] == [streams[i] for i in range(4)]
    other = _run(service, tiny_llama, PROMPTS[:4], "max_new_tokens=64", "batch_size=4", "seed=1")
    assert other.status == "ok", other.error
    assert all(p.results["hf"].token_ids != streams[p.index] for p in other.prompts)
    assert all(p.results["hf"].token_ids == p.results["vllm"].token_ids for p in other.prompts)
