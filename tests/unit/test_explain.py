"""explain() on hand-built side results (pure code above the engines: no engine runs here)."""
from __future__ import annotations

import pytest

from parity_ui.analysis.compare import compare
from parity_ui.core.config import build_config
from parity_ui.analysis.explain import MASKED_LOGPROB, NEAR_TIE_NATS, NOISE_MULTIPLE, explain
from parity_ui.core.settings import LABELS, differing
from parity_ui.core.types import SideInfo, SideResult, TokenStep, TopLogprob

GREEDY = build_config()
A, B = "ref", "cand"  # side names; the first is the reference


def step(pos: int, tid: int, top: list[tuple[int, float]]) -> TokenStep:
    lp = dict(top).get(tid, -9.0)
    return TokenStep(position=pos, token_id=tid, text=f"<{tid}>", logprob=lp, rank=1,
                     top=[TopLogprob(t, v, f"<{t}>") for t, v in top])


def result(side: str, steps: list[TokenStep], finish: str = "length") -> SideResult:
    return SideResult(side=side, prompt_index=0, token_ids=[s.token_id for s in steps], steps=steps,
                      finish_reason=finish)


def sides(a: list[TokenStep], b: list[TokenStep], afinish: str = "length", bfinish: str = "length",
          names: tuple[str, str] = (A, B)) -> tuple[SideResult, SideResult]:
    return result(names[0], a, afinish), result(names[1], b, bfinish)


def run_explain(a: SideResult, b: SideResult, cfg=GREEDY, differing_keys: list[str] | None = None) -> dict:
    """The explanation as it is stored (its JSON), which is what these tests read."""
    return explain(compare(a, b), a, b, cfg, differing_keys).to_json()


def shared(n: int, gap: float = 0.0) -> tuple[list[TokenStep], list[TokenStep]]:
    """n positions where both sides choose token 10+i, with a logprob gap of `gap`."""
    a = [step(i, 10 + i, [(10 + i, -0.1), (99, -3.0)]) for i in range(n)]
    b = [step(i, 10 + i, [(10 + i, -0.1 - gap), (99, -3.0)]) for i in range(n)]
    return a, b


def near_tie() -> tuple[list[TokenStep], list[TokenStep], float]:
    a, b = shared(3)
    m = NEAR_TIE_NATS / 2
    a.append(step(3, 50, [(50, -0.70), (51, -0.70 - m)]))
    b.append(step(3, 51, [(51, -0.69), (50, -0.69 - m / 2)]))
    return a, b, m


def test_identical_streams_are_identical():
    a, b = shared(4, gap=0.01)
    out = run_explain(*sides(a, b))
    assert out["verdict"] == "identical"
    assert out["sides"] == [A, B] and out["index"] is None
    assert out["noise_before"] == pytest.approx(0.01)
    assert "4 tokens" in out["summary"]
    assert out["summary"].startswith(f"{B} matches {A} ")  # names both sides, the reference second


def test_near_tie_is_numerical():
    a, b, m = near_tie()
    out = run_explain(*sides(a, b))
    assert out["verdict"] == "numerical near-tie"
    assert out["index"] == 3 and out["sides"] == [A, B]
    assert out["a"]["name"] == A and out["b"]["name"] == B
    assert (out["a"]["token_id"], out["b"]["token_id"]) == (50, 51)
    assert out["a"]["margin_over_other"] == pytest.approx(m)
    assert out["b"]["margin_over_other"] == pytest.approx(m / 2)
    assert out["a"]["other_token_rank"] == 2 and out["b"]["other_token_rank"] == 2
    assert out["a"]["top12_margin"] == pytest.approx(m)
    assert out["a"]["recorded_k"] == 2
    assert out["accepted_by_vllm_rule"] is True
    assert out["largest_margin"] == pytest.approx(m) and out["tie_bound"] == pytest.approx(NEAR_TIE_NATS)
    assert "near-tie" in out["summary"]
    assert f"at token 3, {A} chose '<50>' and {B} '<51>'" in out["summary"]


def test_explain_is_symmetric_in_the_sides():
    a, b, m = near_tie()
    ra, rb = sides(a, b)
    ab = run_explain(ra, rb)
    ba = run_explain(rb, ra)
    assert ba["sides"] == [B, A]
    assert ba["verdict"] == ab["verdict"] == "numerical near-tie"
    assert ba["a"] == ab["b"] and ba["b"] == ab["a"]
    assert ba["largest_margin"] == pytest.approx(ab["largest_margin"])
    assert f"at token 3, {B} chose '<51>' and {A} '<50>'" in ba["summary"]


def test_large_margin_is_a_real_disagreement():
    a, b = shared(2)
    a.append(step(2, 50, [(50, -0.1), (51, -3.0)]))
    b.append(step(2, 51, [(51, -0.1), (50, -2.5)]))
    out = run_explain(*sides(a, b))
    assert out["verdict"] == "real disagreement"
    assert out["largest_margin"] == pytest.approx(2.9)
    assert out["largest_margin"] > out["tie_bound"]
    assert "real disagreement" in out["summary"] and "outside the other's top-k" not in out["summary"]


def test_other_token_outside_topk_is_a_real_disagreement_even_with_small_top_margin():
    a, b = shared(1)
    a.append(step(1, 50, [(50, -0.70), (52, -0.75)]))
    b.append(step(1, 51, [(51, -0.70), (53, -0.75)]))
    out = run_explain(*sides(a, b))
    assert out["a"]["other_token_rank"] is None and out["b"]["other_token_rank"] is None
    assert out["accepted_by_vllm_rule"] is False
    # no margin over the other's token on either side: the top-1/top-2 margins stand in
    assert out["largest_margin"] == pytest.approx(0.05)
    assert out["verdict"] == "real disagreement"
    assert "outside the other's top-k" in out["summary"]


def test_noise_widens_the_near_tie_bound():
    gap = NEAR_TIE_NATS  # the sides already differ by this much on shared context
    a, b = shared(3, gap=gap)
    m = NEAR_TIE_NATS * 1.5  # above the fixed bound, below NOISE_MULTIPLE * noise
    a.append(step(3, 50, [(50, -0.5), (51, -0.5 - m)]))
    b.append(step(3, 51, [(51, -0.5), (50, -0.5 - m)]))
    out = run_explain(*sides(a, b))
    assert out["noise_before"] == pytest.approx(gap)
    assert out["tie_bound"] == pytest.approx(NOISE_MULTIPLE * gap)
    assert out["verdict"] == "numerical near-tie"


@pytest.mark.parametrize("masked_side", [A, B])
def test_masked_token_names_the_side(masked_side):
    a, b = shared(2)
    picks_eos = step(2, 2, [(2, -0.2), (60, -1.9)])  # this side picks EOS (id 2)
    forbade = step(2, 60, [(60, -0.3), (2, -1e30)])  # this side's processors forbade it
    if masked_side == B:
        a.append(picks_eos), b.append(forbade)
    else:
        a.append(forbade), b.append(picks_eos)
    out = run_explain(*sides(a, b))
    masked = out["b"] if masked_side == B else out["a"]
    assert masked["other_token_logprob"] <= MASKED_LOGPROB
    assert out["verdict"] == "masked token"
    assert f"{masked_side} recorded a masked logprob" in out["summary"]


@pytest.mark.parametrize("stopper", [A, B])
def test_one_side_stopping_on_eos_is_length(stopper):
    a, b = shared(3)
    a[-1] = step(2, 2, [(2, -0.1), (99, -3.0)])
    b[-1] = step(2, 2, [(2, -0.1), (99, -3.0)])
    other = B if stopper == A else A
    if stopper == A:
        b.append(step(3, 40, [(40, -0.2), (99, -3.0)]))
        ra, rb = sides(a, b, afinish="stop")
    else:
        a.append(step(3, 40, [(40, -0.2), (99, -3.0)]))
        ra, rb = sides(a, b, bfinish="stop")
    out = run_explain(ra, rb)
    assert out["verdict"] == "length"
    assert out["stopped_side"] == stopper and out["continued_side"] == other
    assert out["stopped_after"] == 3 and out["continued_to"] == 4
    assert out["stop_token_id"] == 2 and out["stopped_finish_reason"] == "stop"
    assert f"{stopper} stopped after 3 tokens and {other} went on to 4" in out["summary"]
    assert f"stop id only for {stopper}" in out["summary"]


def test_length_limit_on_one_side_is_length():
    a, b = shared(4)
    out = run_explain(*sides(a[:2], b, afinish="length"))
    assert out["verdict"] == "length"
    assert out["stopped_side"] == A and out["stopped_after"] == 2 and out["continued_to"] == 4
    assert out["summary"] == f"{A} ended after 2 tokens (finish=length) while {B} made 4."


def test_sampled_runs_are_expected_to_differ():
    a, b = shared(1)
    a.append(step(1, 50, [(50, -0.1), (51, -3.0)]))
    b.append(step(1, 51, [(51, -0.1), (50, -3.0)]))
    out = run_explain(*sides(a, b), cfg=build_config(overrides=["temperature=0.8"]))
    assert out["verdict"] == "sampling"
    assert "temperature=0.8" in out["summary"]
    # the same fork under greedy decoding is judged on its margins instead
    assert run_explain(*sides(a, b))["verdict"] == "real disagreement"


def test_side_error_and_missing_comparison():
    a, b = shared(3)
    ra, rb = sides(a, b[:1])
    rb.error = "boom"
    out = run_explain(ra, rb)
    assert out["verdict"] == "error"
    assert out["summary"] == f"{B} failed after 1 tokens: boom"
    missing = explain(None, None, None, GREEDY, ["dtype"]).to_json()
    assert missing["verdict"] == "error" and "no comparison" in missing["summary"]
    assert missing["differing_settings"] == ["dtype"]


# -- the settings the two sides differ in ---------------------------------------------------------

def test_summary_names_the_settings_the_sides_differ_only_in():
    a, b = shared(4, gap=0.01)
    keys = ["engine", "dtype", "attention"]
    out = run_explain(*sides(a, b), differing_keys=keys)
    assert out["differing_settings"] == keys
    # the engines differ too: the settings are not the only difference (issue 33 item 11: this said
    # "differ only in weights dtype, attention backend" above a finding "only in engine (hf vs vllm)")
    assert out["summary"].endswith(f" The sides differ in engine; as each side resolved its settings, also in "
                                   f"{LABELS['dtype']}, {LABELS['attention']}.")
    assert "only" not in out["summary"]


def test_identity_settings_alone_add_no_note():
    a, b = shared(4, gap=0.01)
    plain = run_explain(*sides(a, b))
    out = run_explain(*sides(a, b), differing_keys=["engine", "torch", "python", "device"])
    assert out["summary"] == plain["summary"] and "differ" not in out["summary"]
    assert out["differing_settings"] == ["engine", "torch", "python", "device"]


def test_many_differing_settings_are_not_called_only():
    a, b = shared(2)
    a.append(step(2, 50, [(50, -0.1), (51, -3.0)]))
    b.append(step(2, 51, [(51, -0.1), (50, -2.5)]))
    keys = ["dtype", "attention", "cuda_graphs", "prefix_caching"]
    out = run_explain(*sides(a, b), differing_keys=keys)
    assert out["verdict"] == "real disagreement"
    assert " The sides differ in " in out["summary"] and "differ only in" not in out["summary"]
    assert all(LABELS[k] in out["summary"] for k in keys)


def test_near_tie_names_the_settings_from_the_sides_resolved_setups():
    """settings.differing (what the service passes) over two sides' resolved settings, into explain."""
    infos = [SideInfo(name=A, kind="hf", reference=True,
                      resolved={"engine": "hf", "dtype": "bfloat16", "attention": "sdpa"}),
             SideInfo(name=B, kind="vllm", resolved={"engine": "vllm", "dtype": "float32", "attention": "sdpa"}),
             SideInfo(name="third", kind="vllm", resolved={"engine": "vllm", "dtype": "bfloat16",
                                                           "attention": "flash"})]
    a, b, _ = near_tie()
    keys = differing(infos, A, B)
    assert set(keys) == {"engine", "dtype"}  # the third side's attention is not this pair's business
    out = run_explain(*sides(a, b), differing_keys=keys)
    assert out["verdict"] == "numerical near-tie"
    assert out["summary"].endswith(f" The sides differ in engine; as each side resolved its settings, also in "
                                   f"{LABELS['dtype']}.")
    other = run_explain(*sides(a, b, names=(A, "third")), differing_keys=differing(infos, A, "third"))
    assert other["sides"] == [A, "third"]
    assert other["summary"].endswith(f" The sides differ in engine; as each side resolved its settings, also in "
                                     f"{LABELS['attention']}.")


def test_side_name_containing_failed_does_not_make_a_length_fork_an_error():
    a, b = shared(3)
    a[-1] = step(2, 2, [(2, -0.1), (99, -3.0)])
    b[-1] = step(2, 2, [(2, -0.1), (99, -3.0)])
    b.append(step(3, 40, [(40, -0.2), (99, -3.0)]))
    out = run_explain(*sides(a, b, afinish="stop", names=(A, "failed_fix")))
    assert out["stopped_side"] == A and out["continued_side"] == "failed_fix"
    assert out["verdict"] == "length"


def test_the_verdict_and_the_finding_below_it_do_not_contradict_each_other():
    """Issue 33 item 11: HF against vLLM with nothing else set. The finding says the sides differ
    "only in engine (hf vs vllm)"; the verdict said "The sides differ only in attention backend"."""
    infos = [SideInfo(name="hf", kind="hf", reference=True, resolved={"engine": "hf", "attention": "sdpa"}),
             SideInfo(name="vllm", kind="vllm", resolved={"engine": "vllm", "attention": "FLASH_ATTN"})]
    a, b, _ = near_tie()
    out = run_explain(*sides(a, b, names=("hf", "vllm")), differing_keys=differing(infos, "hf", "vllm"))
    finding = "differs from the reference hf, as configured, only in engine (hf vs vllm)"  # preflight's sides-differ finding
    assert "only" in finding and "differ only in" not in out["summary"]
    assert "The sides differ in engine; as each side resolved its settings, also in attention backend." in out["summary"]
    # the same pair on one engine: the attention backend IS the only difference, and says so
    same = [SideInfo(name="x", kind="vllm", reference=True, resolved={"engine": "vllm", "attention": "TRITON_ATTN"}),
            SideInfo(name="y", kind="vllm", resolved={"engine": "vllm", "attention": "FLASH_ATTN"})]
    one = run_explain(*sides(a, b, names=("x", "y")), differing_keys=differing(same, "x", "y"))
    assert one["summary"].endswith(" The sides differ only in attention backend.")


def test_max_num_seqs_is_named_as_a_difference_and_the_kv_cache_size_is_not():
    """max_num_seqs changes which requests share a batch (the numbers of an engine that is not batch
    invariant): two vLLM sides that differ in it and in the attention backend do not differ 'only' in
    the backend. The KV cache's size follows from dtype and memory and is left out of the note."""
    pair = [SideInfo(name="x", kind="vllm", reference=True,
                     resolved={"engine": "vllm", "attention": "TRITON_ATTN", "max_num_seqs": 256, "kv_cache_blocks": 90}),
            SideInfo(name="y", kind="vllm",
                     resolved={"engine": "vllm", "attention": "FLASH_ATTN", "max_num_seqs": 2, "kv_cache_blocks": 40})]
    a, b, _ = near_tie()
    out = run_explain(*sides(a, b, names=("x", "y")), differing_keys=differing(pair, "x", "y"))
    assert "max_num_seqs" in out["summary"] and "attention backend" in out["summary"]
    assert "KV cache" not in out["summary"] and "kv_cache" not in out["summary"]


SHARED_SEED = build_config(None, ["sampling=shared-seed", "temperature=1", "top_p=0.8"])


def test_a_shared_seed_fork_within_the_sampling_margin_is_a_near_tie_and_names_the_kept_sets():
    a, b = shared(3)
    a.append(step(3, 50, [(50, -0.70), (51, -0.80)]))
    b.append(step(3, 51, [(51, -0.69), (50, -0.75)]))
    a[3].margin, a[3].kept, a[3].kept_mass = 0.01, 12, 0.81
    b[3].margin, b[3].kept, b[3].kept_mass = 0.02, 13, 0.83
    out = run_explain(*sides(a, b), cfg=SHARED_SEED)
    assert out["verdict"] == "numerical near-tie" and out["index"] == 3
    assert out["largest_margin"] == pytest.approx(0.02)
    assert out["a"]["sampling_margin"] == 0.01 and out["b"]["kept"] == 13 and out["b"]["kept_mass"] == 0.83
    assert "sampling-margin near-tie" in out["summary"]
    assert f"{A} from 12 kept tokens (S = 0.81)" in out["summary"]


def test_a_shared_seed_fork_past_the_margin_is_a_real_disagreement():
    a, b = shared(3)
    a.append(step(3, 50, [(50, -0.70), (51, -0.80)]))
    b.append(step(3, 51, [(51, -0.69), (50, -0.75)]))
    a[3].margin, b[3].margin = 3.0, 2.5
    out = run_explain(*sides(a, b), cfg=SHARED_SEED)
    assert out["verdict"] == "real disagreement" and out["largest_margin"] == 3.0
    assert "under the same noise" in out["summary"]
    # Without recorded draws the fork cannot be weighed, and the summary says why.
    a[3].margin = b[3].margin = None
    out = run_explain(*sides(a, b), cfg=SHARED_SEED)
    assert out["verdict"] == "real disagreement" and "not recorded" in out["summary"]
    # Native sampling keeps its verdict: the sides drew from their own streams.
    native = build_config(None, ["temperature=1"])
    assert run_explain(*sides(a, b), cfg=native)["verdict"] == "sampling"


def test_a_shared_seed_fork_of_the_kept_sets_is_named_with_both_sides_boundary_masses():
    """Issue 46 item 3: bf16, top_p 0.8, a fork at token 3 where the top token held 0.7825 of one side's
    distribution and 0.8029 of the other's: the cut kept it alone on one side (no draw: its margin the
    1e30 placeholder) and two tokens on the other. A top-p boundary near-tie, not a real disagreement."""
    import math

    a, b = shared(3)
    for i in range(3):
        a[i].kept, a[i].kept_mass, a[i].kept_hash, a[i].margin = 2, 0.9, 7, 1.0
        b[i].kept, b[i].kept_mass, b[i].kept_hash, b[i].margin = 2, 0.9, 7, 1.0
    a.append(step(3, 51, [(50, math.log(0.7825)), (51, math.log(0.16)), (52, math.log(0.02))]))
    b.append(step(3, 50, [(50, math.log(0.8029)), (51, math.log(0.15)), (52, math.log(0.02))]))
    a[3].kept, a[3].kept_mass, a[3].kept_hash, a[3].margin = 2, 0.9425, 11, 0.4
    b[3].kept, b[3].kept_mass, b[3].kept_hash, b[3].margin = 1, 0.8029, 12, 1e30
    out = run_explain(*sides(a, b), cfg=SHARED_SEED)
    assert out["verdict"] == "kept-set near-tie" and out["index"] == 3, out
    s = out["summary"]
    assert "top-p boundary near-tie" in s and "the kept sets differ at the fork" in s, s
    assert f"{A} kept 2 tokens (S = 0.9425), {B} kept 1 token (S = 0.8029)" in s, s
    assert f"the top token held 0.8029 of {B}'s distribution (at or over top_p 0.8" in s, s
    assert f"0.7825 of {A}'s (under it" in s, s
    assert "1e+30" not in s and "e+29" not in s
    assert out["largest_margin"] == pytest.approx(math.log(0.8029 / 0.1971) - math.log(0.7825 / 0.2175))
    # Far apart around the cut: the sets differ because the distributions do.
    b[3] = step(3, 50, [(50, math.log(0.97)), (51, math.log(0.02)), (52, math.log(0.005))])
    b[3].kept, b[3].kept_mass, b[3].kept_hash, b[3].margin = 1, 0.97, 12, 1e30
    out = run_explain(*sides(a, b), cfg=SHARED_SEED)
    assert out["verdict"] == "real disagreement" and "0.9700" in out["summary"] and "1e+30" not in out["summary"]
    # At another temperature the cut's masses cannot be rebuilt from the raw top-k: said so, not guessed.
    hot = build_config(None, ["sampling=shared-seed", "temperature=0.7", "top_p=0.8"])
    out = run_explain(*sides(a, b), cfg=hot)
    assert out["verdict"] == "kept sets differ" and "tempered distribution" in out["summary"]
    # One side kept one token where the sets agree elsewhere: its margin is never printed as a number.
    a[3].kept_hash = b[3].kept_hash = 12
    out = run_explain(*sides(a, b), cfg=SHARED_SEED)
    assert "1e+30" not in out["summary"] and out["largest_margin"] == pytest.approx(0.4)
