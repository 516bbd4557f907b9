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

    # The same seed: the same streams (a smaller run, other batch mates: the noise is per prompt).
    again = _run(service, tiny_llama, PROMPTS[:4], "max_new_tokens=64", "batch_size=4")
    assert again.status == "ok", again.error
    assert [p.results["vllm"].token_ids for p in again.prompts] == [streams[i] for i in range(4)]
    assert [p.results["hf"].token_ids for p in again.prompts] == [streams[i] for i in range(4)]


def test_another_seed_draws_another_stream(tiny_llama):
    """In process (no worker: vLLM's seed is a load setting, a new seed would restart its engine):
    transformers' generate with the shared-seed processor, seed 0 twice and seed 1."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessorList

    from parity_ui.engines.shared_seed import HfSharedSeedProcessor, Settings

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(tiny_llama)(PROMPTS[0])["input_ids"]

    def stream(seed):
        proc = HfSharedSeedProcessor(Settings(seed, 1.0), [ids], len(ids))
        gc = GenerationConfig(max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None)
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([ids]), generation_config=gc,
                                 logits_processor=LogitsProcessorList([proc]))
        return out[0, len(ids):].tolist()

    s0 = stream(0)
    assert stream(0) == s0 != stream(1)


def test_bfloat16_forks_are_explained_by_the_sampling_margin(service, tiny_llama):
    """bf16 moves the perturbed maximum where two tokens' noisy scores nearly tie: every fork is
    a sampling-margin near-tie with both sides' draws named."""
    run = _run(service, tiny_llama, PROMPTS[:6], "max_new_tokens=64", "batch_size=6", "dtype=bfloat16")
    assert run.status in ("ok", "diverged"), run.error
    forks = [c for p in run.prompts for c in p.comparisons if not c.identical]
    assert forks  # bf16 moves some draw on this model (4 of 6 prompts when written)
    for c in forks:
        e = c.explanation
        assert e.verdict == "numerical near-tie", e.summary
        assert "sampling-margin near-tie" in e.summary and e.a.sampling_margin is not None
        assert e.largest_margin <= e.tie_bound
    print(f"bf16 shared-seed: {len(forks)} of {len(run.prompts)} prompts fork; margins "
          f"{[round(c.explanation.largest_margin, 4) for c in forks]}")


def test_top_p_reports_kept_mass_and_both_ratios(service, tiny_llama):
    """top_p=0.8, an fp32 trainer (hf) against a bf16 rollout (vllm): per token each side's kept set and
    mass; pooled, the naive ratio (raw trainer over processed rollout) carries log S and leaves
    [0.9, 1.1] far more often than the ratio renormalised over the replayed kept set."""
    from parity_ui.render.report import format_summary, run_json

    run = _run(service, tiny_llama, PROMPTS[:6], "max_new_tokens=32", "batch_size=6", "top_p=0.8",
               sides=["hf=hf,dtype=float32", "vllm=vllm,dtype=bfloat16"])
    assert run.status in ("ok", "diverged"), run.error
    steps = [s for p in run.prompts for s in p.results["vllm"].steps]
    assert all(s.kept is not None and 1 <= s.kept < 1024 and 0.79 <= s.kept_mass < 1 for s in steps)
    assert all(s.processed_logprob >= s.logprob for s in steps)  # renormalised over less than the whole vocabulary
    figs = run_json(run)["sampling"]["vllm"]
    assert figs["tokens"] > 20 and 0.79 <= figs["kept_mass_mean"] < 0.9
    naive, renorm = figs["naive_outside_0.9_1.1"], figs["renorm_outside_0.9_1.1"]
    assert renorm < naive and naive > 0.5, figs
    assert figs["raw_minus_processed_mean"] < 0  # raw below processed: log S < 0
    text = format_summary(run)
    assert "naive ratio outside [0.9, 1.1]" in text and "renormalised ratio outside [0.9, 1.1]" in text
    assert "kept mass S mean" in text
    print(f"top_p=0.8 fp32 vs bf16: {figs['tokens']} tokens, S mean {figs['kept_mass_mean']:.3f}, outside "
          f"[0.9, 1.1]: naive {naive:.1%}, renormalised {renorm:.1%}, kept sets differ {figs['kept_sets_differ']:.1%}")


def test_a_free_workload_keeps_each_comparisons_kept_mass(service, tiny_llama):
    """A free-running workload in shared-seed mode (both sides draw): every stored comparison carries
    its kept mass, and --json pools it per side."""
    from parity_ui.commands.workload.run import WorkloadRequest, run_workload
    from parity_ui.core.workload_record import WorkloadOptions
    from parity_ui.render.report import run_json

    cfg = build_config(None, ["dtype=float32", "ignore_eos=true", "sampling=shared-seed", "temperature=1",
                              "top_p=0.8", "max_new_tokens=16", "batch_size=8"])
    opts = WorkloadOptions(chunk=8, floor="none")
    run = run_workload(service, WorkloadRequest(model=str(tiny_llama), prompts=[PromptSpec(text=p) for p in PROMPTS[:8]],
                                                config=cfg, options=opts))
    assert run.status == "ok", run.error  # float32: every prompt identical
    stored = service.store.get_run(run.id)
    kept = [c.measures.get("kept_mass") for p in stored.prompts for c in p.comparisons]
    assert len(kept) == 8 and all(k is not None and k.tokens == 16 for k in kept)
    figs = run_json(stored)["sampling"]["vllm"]
    assert figs["tokens"] == 128 and figs["renorm_outside_0.9_1.1"] == 0.0 and figs["naive_outside_0.9_1.1"] == 1.0
    assert figs["kept_sets_differ"] == 0.0  # the same numbers in float32: the same kept sets


def test_full_distribution_in_a_scored_workload_fp32_at_the_floor_bf16_above(service, tiny_llama):
    """full_distribution=true in scored mode (issue 31 item 3): the vLLM side writes its full rows as it
    generates, the hf reference meets them while scoring, the kernel floor meets the reference's. In
    float32 every position is at the floor (KL ~ 0, TV ~ 0, top-1 100%); a bf16 vLLM side is above it.
    KL is never negative; the figures are pooled, judged, stored and shown."""
    import os

    from parity_ui.commands.workload.run import WorkloadRequest, run_workload
    from parity_ui.core.figures import FAMILIES
    from parity_ui.core.workload_record import WorkloadOptions
    from parity_ui.render.report import run_json
    from parity_ui.render.text import format_workload

    def scored(side_dtype):
        cfg = build_config(None, ["ignore_eos=true", "max_new_tokens=12", "batch_size=2", "full_distribution=true"],
                           sides=["hf=hf,dtype=float32", f"vllm=vllm,dtype={side_dtype}"])
        return run_workload(service, WorkloadRequest(model=str(tiny_llama), config=cfg,
                                                     prompts=[PromptSpec(text=p) for p in PROMPTS[:2]],
                                                     options=WorkloadOptions(mode="scored", floor="kernel", chunk=2)))

    fp32 = scored("float32")
    assert fp32.status in ("ok", "diverged"), fp32.error
    rep = fp32.workload
    d, fl = rep.sides["vllm"].stats.family("distribution"), rep.floor_figures.stats.family("distribution")
    assert d["positions"] == 24 and fl["positions"] == 24
    assert d["kl_max"] < 1e-6 and d["kl_rev_max"] < 1e-6 and d["tv_max"] < 1e-3
    assert d["top1_agree"] == 1.0 and d["topk_contained"] == 1.0
    assert min(d[k] for k in FAMILIES["distribution"] if k.startswith("kl")) >= 0.0
    assert "within noise" in rep.sides["vllm"].verdicts.get("distribution")
    # Stored per position on the side's steps; no scratch rows left behind.
    stored = service.store.get_run(fp32.id)
    steps = stored.prompts[0].results["vllm"].steps
    assert all(s.kl is not None and s.kl >= 0 and s.top1 == 1 for s in steps)
    for scratch in (__import__("tempfile").gettempdir(), "/dev/shm"):  # in memory where it holds them
        assert not [f for f in os.listdir(scratch) if f.startswith("parity-rows-")] if os.path.isdir(scratch) else True
    text = format_workload(stored.workload)
    assert "KL(ref‖side) mean" in text and "top-1 agreement" in text
    assert run_json(stored)["workload"]["sides"]["vllm"]["stats"]["distribution"]["positions"] == 24

    bf16 = scored("bfloat16")
    assert bf16.status in ("ok", "diverged"), bf16.error
    b = bf16.workload.sides["vllm"].stats.family("distribution")
    assert b["kl_mean"] > 100 * max(d["kl_mean"], 1e-12) and b["tv_mean"] > 10 * max(d["tv_mean"], 1e-9)
    assert min(b["kl_mean"], b["kl_rev_mean"]) >= 0.0
    assert "exceeds noise" in bf16.workload.sides["vllm"].verdicts.get("distribution")
    # A single comparison: the vLLM side writes its rows as it generates, the hf reference meets them while
    # cross-scoring the side's tokens (the same context on both).
    from parity_ui.render.report import format_summary

    one = service.run(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text=p) for p in PROMPTS[:2]],
                                 config=build_config(None, ["dtype=float32", "ignore_eos=true", "max_new_tokens=12",
                                                            "batch_size=2", "full_distribution=true"])))
    assert one.status == "ok", one.error
    for p in one.prompts:
        (c,) = p.comparisons
        assert c.measures.get("distribution")["generator"] == "vllm" and c.measures.get("distribution")["scorer"] == "hf"
        assert c.measures.get("distribution")["positions"] == 12 and c.measures.get("distribution")["kl_max"] < 1e-6
        assert c.measures.get("distribution")["top1_agree"] == 1.0
    assert "full distribution (vllm's tokens, rows met by hf, 12 positions)" in format_summary(one)
    stored = service.store.get_run(one.id).prompts[0].comparisons[0].measures["distribution"]
    assert stored == one.prompts[0].comparisons[0].measures["distribution"]  # read back as the record it was
    print(f"full distribution, tiny model, 2 x 12 scored: fp32 KL mean {d['kl_mean']:.3g} max {d['kl_max']:.3g} "
          f"TV mean {d['tv_mean']:.3g}; floor KL mean {fl['kl_mean']:.3g}; bf16 KL mean {b['kl_mean']:.3g} "
          f"p99 {b['kl_p99']:.3g} TV mean {b['tv_mean']:.3g} top-1 {b['top1_agree']:.0%}")
