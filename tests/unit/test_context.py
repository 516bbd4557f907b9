"""The context of a run: what each vLLM side is given, and the checks made before anything loads.

Pure functions first (sizing, the model's positions, the shared token-count check, the KV figures),
then `prepare` on tiny model folders (tokenizer only, no weights load): the sizing reaches each
vLLM side's arguments, and a context past the positions or the KV cache is refused with the fix.
The real-engine run of a long-context model is in test_engines.py; the CLI refusals in test_cli.py.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest

from parity_ui.run import memory_plan
from parity_ui.core.config import build_config
from parity_ui.core.context import (
    CONTEXT_FLOOR,
    check_context,
    kv_bytes,
    kv_layout,
    kv_per_token,
    pool_bytes,
    positions_limit,
    sized_context,
    tokens_that_fit,
)
from parity_ui.core.errors import ConfigError, PromptError, SideError
from parity_ui.core.mapping import mapping_table, resolve
from parity_ui.run.prepare import RunRequest, prepare
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.core.types import ModelInfo

GIB = 2**30
PROMPT = "def main(args):"


# -- sizing ------------------------------------------------------------------------------------------

def test_the_context_is_the_need_bucketed_and_capped_by_the_model():
    assert sized_context(60, 32768) == CONTEXT_FLOOR  # a short run: the floor
    assert sized_context(CONTEXT_FLOOR + 1, None) == 2 * CONTEXT_FLOOR  # then powers of two
    assert sized_context(9000, None) == 16384
    assert sized_context(60, 512) == 512  # never more than the model serves
    assert sized_context(20000, 20480) == 20480
    for need in (1, 500, 1023, 1024, 1025, 5000, 70000):
        got = sized_context(need, None)
        assert need <= got < 2 * max(need, CONTEXT_FLOOR)  # never short, at most 2x headroom


def test_small_prompt_changes_keep_the_context_so_a_warm_worker_is_reused():
    assert len({sized_context(n + 64, None) for n in range(10, 900)}) == 1
    assert len({sized_context(n, None) for n in range(1025, 2049)}) == 1


def _model(**kw) -> ModelInfo:
    base = dict(name="m", path="/m", model_type="llama", max_position_embeddings=4096)
    return ModelInfo(**{**base, **kw})


@pytest.mark.parametrize("rope, model_type, limit", [
    (None, "llama", 4096),
    ({"rope_type": "linear", "factor": 2.0}, "llama", 8192),
    ({"rope_type": "dynamic", "factor": 4.0}, "llama", 16384),
    ({"rope_type": "llama3", "factor": 8.0}, "llama", 4096),  # llama3 states the scaled length already
    ({"rope_type": "linear", "factor": 8.0}, "gemma3_text", 4096),  # so does Gemma 3 (vLLM skips it too)
])
def test_the_positions_a_model_serves_count_its_rope_scaling(rope, model_type, limit):
    assert positions_limit(_model(model_type=model_type), rope) == limit
    assert positions_limit(_model(model_type=model_type, rope_scaling=rope)) == limit  # the model's own
    assert positions_limit(_model(max_position_embeddings=None)) is None


def test_one_context_check_for_the_app_and_prepare():
    ok = check_context([12, 30], 48, 32768)
    assert ok.over is None and ok.need == 78 and ok.vllm_context == CONTEXT_FLOOR and ok.message == ""
    assert check_context([12], 48, 32768, max_model_len=4096).vllm_context == 4096
    over = check_context([10, 600, 700], 64, 512)
    assert over.over == 1  # the first prompt over the limit
    assert over.message == ("prompt 1 has 600 tokens; with max_new_tokens=64 it needs 664 positions, over the "
                            "context of 512")
    assert "shorten the prompt" in over.fix and "max_model_len" in over.fix
    assert check_context([600], 64, 512).message.startswith("the prompt has 600 tokens")
    assert check_context([10**6], 64, None).over is None  # unknown context: nothing to check


def test_the_app_shows_the_same_check_as_a_card():
    from parity_ui.ui.compare_tab import CompareTab

    cfg = build_config(None, ["max_new_tokens=64"])
    card = CompareTab._count_html([600], 512, cfg)
    assert "Prompt too long" in card and check_context([600], 64, 512).message in card
    line = CompareTab._count_html([12], 32768, cfg)
    assert "context 32,768" in line and f"a vLLM side gets {CONTEXT_FLOOR:,}" in line


# -- the KV cache --------------------------------------------------------------------------------------

def test_kv_figures_match_vllms_for_the_issue_model():
    """18 layers, 1 KV head of 256, a 512-token sliding window, float32, 32,768 positions: vLLM 0.32
    said "1.13 GiB KV cache is needed, which is larger than the available KV cache memory (1.0 GiB)"."""
    model = _model(num_hidden_layers=18, num_key_value_heads=1, head_dim=256, max_position_embeddings=32768,
                   sliding_window=512)
    per = kv_per_token(model, 4)
    assert per.bytes == 2 * 18 * 1 * 256 * 4 and per.extra_blocks == 1
    assert str(round(kv_bytes(32768, per, 128) / GIB, 2)) == "1.13"  # vLLM's format_gib
    fits = tokens_that_fit(GIB, per, 128)
    assert fits % 128 == 0 and pool_bytes(fits, per, 128) <= GIB < pool_bytes(fits + 1, per, 128)
    plain = kv_per_token(_model(num_hidden_layers=18, num_key_value_heads=1, head_dim=256), 4)
    assert kv_bytes(32768, plain, 128) == GIB * 9 // 8  # without a window: exactly 256 blocks
    assert kv_bytes(129, plain, 128) == 2 * 128 * plain.bytes  # whole blocks


def test_the_length_that_fits_is_the_one_vllm_estimates():
    """3 layers, 4 KV heads of 128, float32, 1 GiB: vLLM 0.32 refused 131,072 positions saying "the
    estimated maximum model length is 87168" (its block pool holds one block back)."""
    per = kv_per_token(_model(num_hidden_layers=3, num_key_value_heads=4, head_dim=128), 4)
    assert tokens_that_fit(GIB, per, 128) == 87168
    assert f"{kv_bytes(131072, per, 128) / GIB:.2f}" == "1.50"


def test_kv_per_rank_under_tensor_and_pipeline_parallel():
    model = _model(num_hidden_layers=30, num_key_value_heads=8, head_dim=128)
    assert kv_per_token(model, 2, tp=2).kv_heads == 4
    assert kv_per_token(model, 2, tp=16).kv_heads == 1  # vLLM replicates KV heads past TP = heads
    assert kv_per_token(model, 2, pp=4).layers == 8


def test_caches_that_are_not_plain_kv_are_not_estimated():
    assert kv_layout({"num_key_value_heads": 8}) == "standard"
    assert kv_layout({"layer_types": ["sliding_attention", "full_attention"]}) == "standard"
    assert kv_layout({"kv_lora_rank": 512}) == "mla"
    assert kv_layout({"layer_types": ["linear_attention", "full_attention"]}) == "hybrid"
    assert kv_layout({"mamba_d_state": 16}) == "hybrid"
    geometry = dict(num_hidden_layers=2, num_key_value_heads=2, head_dim=64)
    assert kv_per_token(_model(kv_layout="mla", **geometry), 2) is None
    assert kv_per_token(_model(num_hidden_layers=2, num_key_value_heads=2), 2) is None  # no head_dim known


# -- prepare: tiny model folders, tokenizer only ----------------------------------------------------------

@pytest.fixture(scope="module")
def long_model(build_tiny):
    """131,072 positions; 12 KiB of float32 KV a token: its whole context needs 1.5 GiB, over a CPU
    vLLM side's default 1 GiB (what made vLLM refuse to start before the context was sized)."""
    return build_tiny("long", arch="llama", max_position_embeddings=131072, num_hidden_layers=3,
                      num_key_value_heads=4, head_dim=128)


def _prepare(model, *overrides, prompts=(PROMPT,), sides=None, gpu=False, min_context=0):
    cfg = build_config(None, ["dtype=float32", *overrides], sides=sides)
    return prepare(RunRequest(model=str(model), prompts=[PromptSpec(text=p) for p in prompts], config=cfg,
                              min_context=min_context), gpu)


def test_each_vllm_side_gets_the_runs_need_bucketed(long_model):
    prep = _prepare(long_model, "max_new_tokens=48", sides=["ref=hf", "a=vllm", "b=vllm-server"])
    need = len(prep.prompts[0].token_ids) + 48
    assert prep.resolved.context_need == {"ref": need, "a": need, "b": need}
    assert prep.side("a").args.llm["max_model_len"] == prep.side("b").args.llm["max_model_len"] == CONTEXT_FLOOR
    assert "max_model_len" not in prep.side("ref").args.load  # HF has no such limit
    per = kv_per_token(prep.model, 4)
    assert kv_bytes(131072, per, memory_plan.CPU_BLOCK) > GIB  # the model's own context would not fit
    # A slightly longer prompt: the same context, so the warm worker's load key does not change.
    longer = _prepare(long_model, "max_new_tokens=48", prompts=(PROMPT + " x = 1",), sides=["ref=hf", "a=vllm"])
    same = _prepare(long_model, "max_new_tokens=48", sides=["ref=hf", "a=vllm"])
    assert longer.side("a").load_key == same.side("a").load_key


def test_a_longer_need_from_the_caller_counts(long_model):
    prep = _prepare(long_model, "max_new_tokens=8", min_context=3000)
    assert prep.resolved.context_need["vllm"] == 3000 and prep.side("vllm").args.llm["max_model_len"] == 4096


def test_max_model_len_past_the_models_positions_is_refused_before_loading(build_tiny):
    short = build_tiny("short", arch="llama", max_position_embeddings=512)
    with pytest.raises(ConfigError) as e:
        _prepare(short, "max_model_len=2100")
    assert e.value.key == "max_model_len"
    assert "2,100 is over the 512 positions" in e.value.message and "side 'vllm'" in e.value.message
    assert "lower max_model_len to 512 or less" in e.value.fix and "rope_scaling" in e.value.fix
    # RoPE scaling extends what the model serves: linear x 8 makes 4,096 positions.
    prep = _prepare(short, "max_model_len=2100", "rope_scaling={rope_type: linear, factor: 8.0}")
    assert prep.side("vllm").args.llm["max_model_len"] == 2100
    with pytest.raises(ConfigError, match=r"4,096 positions \(512 x RoPE factor 8\)"):
        _prepare(short, "max_model_len=5000", "rope_scaling={rope_type: linear, factor: 8.0}")
    # HF sides have no context limit: an HF-only run may go past the positions (preflight warns).
    assert _prepare(short, "max_model_len=2100", sides=["a=hf", "b=hf"]).max_context == 2100


def test_vllms_own_switch_lets_a_context_past_the_positions_through(build_tiny, monkeypatch):
    short = build_tiny("short", arch="llama", max_position_embeddings=512)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert _prepare(short, "max_model_len=2100").side("vllm").args.llm["max_model_len"] == 2100


def test_max_model_len_over_the_kv_cache_is_refused_with_the_length_that_fits(long_model):
    with pytest.raises(SideError) as e:
        _prepare(long_model, "max_model_len=131072")
    per = kv_per_token(describe(long_model), 4)
    fits = tokens_that_fit(GIB, per, memory_plan.CPU_BLOCK)
    err = e.value
    assert err.side == "vllm" and err.key == "vllm.kv_cache_gib"
    assert "max_model_len=131,072 needs 1.50 GiB of KV cache" in err.message
    assert "12.0 KiB a token" in err.message and "kv_cache_gib=1" in err.message
    assert f"lower max_model_len to {fits:,} or less" in err.fix
    gib = _suggested_gib(err.fix)
    assert 1.5 < gib <= 1.51  # 1.5 GiB of blocks plus the one vLLM's pool holds back
    # The fix works: either number is accepted.
    assert _prepare(long_model, f"max_model_len={fits}").side("vllm").args.llm["max_model_len"] == fits
    assert _prepare(long_model, "max_model_len=131072", f"vllm.kv_cache_gib={gib}").side("vllm").args.llm[
        "max_model_len"] == 131072
    with pytest.raises(SideError):
        _prepare(long_model, "max_model_len=131072", "vllm.kv_cache_gib=1.5")


def _suggested_gib(fix: str) -> float:
    m = re.search(r"raise this side's kv_cache_gib to ([0-9.]+) \(--set vllm\.kv_cache_gib=\1\)", fix)
    assert m, fix
    return float(m.group(1))


def describe(model):
    from parity_ui.inputs.models import describe_model

    return describe_model(str(model))


def _long_prompt(tokens_wanted: int) -> str:
    return "x = 1\n" * (tokens_wanted // 4)


def test_a_bucket_the_kv_cache_cannot_hold_is_trimmed_to_what_it_holds(long_model):
    """64 MiB of KV holds 5,376 positions of this model; a ~4,500-token run's bucket (8,192) does not fit."""
    prep = _prepare(long_model, "max_new_tokens=8", "vllm.kv_cache_gib=0.0625", prompts=(_long_prompt(4400),))
    need = prep.resolved.context_need["vllm"]
    fits = tokens_that_fit(0.0625 * GIB, kv_per_token(prep.model, 4), memory_plan.CPU_BLOCK)
    assert need <= fits < sized_context(need, None)
    assert prep.side("vllm").args.llm["max_model_len"] == fits


def test_a_run_whose_own_need_overflows_the_kv_cache_is_refused(long_model):
    with pytest.raises(SideError) as e:
        _prepare(long_model, "max_new_tokens=8", "vllm.kv_cache_gib=0.0625", prompts=(_long_prompt(6000),))
    err = e.value
    assert err.side == "vllm" and "this run needs" in err.message and "positions" in err.message
    assert "over this side's kv_cache_gib=0.0625" in err.message and "shorten the prompt" in err.fix
    gib = _suggested_gib(err.fix)
    prep = _prepare(long_model, "max_new_tokens=8", f"vllm.kv_cache_gib={gib}", prompts=(_long_prompt(6000),))
    assert prep.side("vllm").args.llm["max_model_len"] >= prep.resolved.context_need["vllm"]


def test_a_prompt_past_the_context_is_the_same_check_the_app_shows(build_tiny):
    short = build_tiny("short", arch="llama", max_position_embeddings=64)
    with pytest.raises(PromptError) as e:
        _prepare(short, "max_new_tokens=8", prompts=(_long_prompt(200),))
    from parity_ui.inputs.prompts import tokenizer_for

    n = tokenizer_for(str(short), False).count(PromptSpec(text=_long_prompt(200)), False)
    assert e.value.message == check_context([n], 8, 64).message


def test_on_a_gpu_the_kv_check_uses_the_memory_plans_share(long_model, monkeypatch):
    monkeypatch.setattr(memory_plan, "gpus", lambda: [{"index": "0", "name": "test", "memory_mib": str(4 * 1024),
                                                       "compute_cap": "9.0"}])
    prep = _prepare(long_model, "max_new_tokens=8", sides=["ref=hf", "b=vllm"], gpu=True)
    assert prep.side("b").args.llm["max_model_len"] == CONTEXT_FLOOR
    with pytest.raises(SideError) as e:
        _prepare(long_model, "max_model_len=131072", sides=["ref=hf", "b=vllm"], gpu=True)
    err = e.value
    assert err.key == "b.gpu_memory_utilization" and "gpu_memory_utilization=0.5 of 4 GiB" in err.message
    assert "lower max_model_len to" in err.fix and "raise this side's gpu_memory_utilization to" in err.fix


def _on_a_gpu(monkeypatch, gib=80):
    monkeypatch.setattr(memory_plan, "gpus", lambda: [{"index": "0", "name": "test", "memory_mib": str(gib * 1024),
                                                       "compute_cap": "9.0"}])


def test_a_workloads_floor_side_gets_a_gpu_share_planned_with_the_others(long_model, monkeypatch):
    # Found on an H100: a vLLM reference's floor side, added after prepare(), started with
    # gpu_memory_utilization=None and vLLM refused it (a bisect's first trial, any --floor batch run).
    from parity_ui.commands.workload.run import floor_plan
    from parity_ui.core.workload_record import WorkloadOptions

    _on_a_gpu(monkeypatch)
    prep = _prepare(long_model, "max_new_tokens=8", sides=["ref=vllm", "b=vllm,gpu_memory_utilization=0.2"], gpu=True)
    assert prep.side("ref").args.llm["gpu_memory_utilization"] == 0.5  # alone with b's 0.2: the auto cap
    floor, spec = floor_plan(prep, WorkloadOptions(mode="free", floor="batch"))
    ref_share = prep.side("ref").args.llm["gpu_memory_utilization"]
    floor_share = floor.args.llm["gpu_memory_utilization"]
    assert spec.side == floor.name == "floor"
    assert floor_share == ref_share and 0 < ref_share < 0.5  # the two unset shares now split what b leaves
    assert ref_share + floor_share + 0.2 <= memory_plan.HEADROOM
    assert prep.side("b").args.llm["gpu_memory_utilization"] == 0.2  # the user's share stays
    assert floor.args.llm["max_model_len"] == prep.side("ref").args.llm["max_model_len"]
    assert prep.resolved.context_need["floor"] == prep.resolved.context_need["ref"]
    plans = [w for w in prep.warnings if w.code == "memory-plan"]
    assert len(plans) == 1 and "floor" in plans[0].message


def test_sides_planned_without_prompts_get_gpu_shares_too(long_model, monkeypatch):
    # A layer localisation plans its two sides with plan_sides(): on a GPU each vLLM side needs a share.
    from parity_ui.run.prepare import plan_sides

    _on_a_gpu(monkeypatch)
    cfg = build_config(None, ["dtype=float32"], sides=["a=vllm", "b=vllm"])
    plans = plan_sides(str(long_model), cfg, True, context_need=100)
    shares = [p.args.llm["gpu_memory_utilization"] for p in plans]
    assert shares[0] == shares[1] and 0 < shares[0] <= memory_plan.HEADROOM / 2


# -- the mapping table -------------------------------------------------------------------------------------

def test_the_mapping_table_says_where_an_unset_max_model_len_comes_from(long_model):
    info = describe(long_model)
    row = {r.key: r for r in mapping_table(build_config(None, []), resolve(info, [], False))}["max_model_len"]
    assert row.value is None
    assert "the run's need" in row.sides["vllm"] and "at most 131072" in row.sides["vllm"]
    assert row.sides["hf"] == "(not used)"
    set_row = {r.key: r for r in mapping_table(build_config(None, ["max_model_len=4096"]),
                                               resolve(info, [], False))}["max_model_len"]
    assert set_row.sides["vllm"] == "LLM.max_model_len=4096"


def test_a_side_with_its_own_shorter_model_is_refused_naming_it(long_model, tmp_path):
    own = tmp_path / "own"
    shutil.copytree(long_model, own)
    cfg = json.loads((own / "config.json").read_text())
    (own / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 16}))
    with pytest.raises(SideError) as e:
        _prepare(long_model, "max_new_tokens=32", sides=["ref=hf", f"b=vllm,model={own}"])
    assert e.value.side == "b" and "over the 16 positions" in e.value.message
