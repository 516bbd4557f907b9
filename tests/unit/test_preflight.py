"""Preflight checks: each one triggered by a model folder, config or set of sides built for it, and
not by a clean one.

Fast: `prepare` loads only the tokenizer (on the CPU plan, so the findings do not depend on the
machine's GPUs); model folders are one tiny model copied and edited (config.json,
generation_config.json, chat template; tests/preflight_models.py). The engine run that shows the findings
reaching a stored run and the CLI JSON is tests/engines/test_preflight_engines.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from parity_ui.run import hardware

from parity_ui.run import preflight
from parity_ui.core.config import SIDE_PRESETS, build_config
from parity_ui.core.fixes import setting_words
from parity_ui.run.preflight import STABLE_BATCH_BOUND, run_preflight
from parity_ui.run.prepare import prepare
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.service import RunRequest
from parity_ui.core.types import Finding

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from preflight_models import PROMPT, TRAP, base, variant  # noqa: E402,F401  (base, variant: fixtures)


def prepared(model, *overrides, prompts=(PROMPT,), sides=None, base_cfg=None):
    cfg = build_config(overrides=["dtype=float32", *overrides], sides=sides, base=base_cfg)
    return prepare(RunRequest(model=str(model), prompts=[PromptSpec(text=p) for p in prompts], config=cfg), False)


def all_findings(model, *overrides, **kw) -> list[Finding]:
    return run_preflight(prepared(model, *overrides, **kw))


def findings(model, *overrides, **kw) -> dict[str, Finding]:
    return {f.code: f for f in all_findings(model, *overrides, **kw)}


def side_findings(model, *overrides, **kw) -> dict[tuple[str, str | None], Finding]:
    """(code, side) -> finding: a code can come once per side."""
    return {(f.code, f.side): f for f in all_findings(model, *overrides, **kw)}


def test_a_clean_model_and_config_only_say_what_the_sides_differ_in(base):
    found = all_findings(base)
    assert [f.code for f in found] == ["sides-differ"]
    f = found[0]
    assert f.severity == "info" and f.side == "vllm" and f.setting is None
    assert f.message == "side vllm differs from the reference hf, as configured, only in engine (hf vs vllm)."


def test_preflight_is_what_prepare_stores(base):
    prep = prepared(base, "temperature=0.5")
    codes = [f.code for f in run_preflight(prep)]
    assert "sampled-streams" in codes
    assert [f.code for f in prep.warnings][:len(codes)] == codes  # the memory plan's come after


def test_every_finding_has_a_message_a_fix_and_a_setting_that_applies(variant):
    model = variant(generation={"do_sample": True, "temperature": 0.7, "eos_token_id": [2, 4]})
    overrides = ["temperature=0.5", "batch_size=20", "chat=true", "repetition_penalty=1.2",
                 "b.enable_prefix_caching=true", "b.enable_chunked_prefill=true", "c.batch_invariant=true"]
    sides = ["ref=hf,dtype=bfloat16,fp32_logits=true", "b=vllm,dtype=bfloat16", "c=vllm,dtype=bfloat16"]
    found = all_findings(model, *overrides, prompts=(PROMPT, "x"), sides=sides)
    codes = {f.code for f in found}
    assert len(codes) >= 10
    names = {"ref", "b", "c"}
    for f in found:
        assert f.severity in ("info", "warning", "error") and f.message
        assert "\n" not in f.message
        # Every finding says what to do, but the description of what the sides differ in.
        assert f.fix or f.code == "sides-differ", f.code
        assert f.side is None or f.side in names
        if f.setting:
            # The concrete change is a --set the same run accepts.
            flag = setting_words(f.setting["key"], f.setting["value"], "cli")
            assert flag.startswith("--set ")
            build_config(overrides=["dtype=float32", *overrides, flag.removeprefix("--set ")], sides=sides)


def test_a_findings_setting_removes_it(base):
    sides = ["ref=hf", "b=vllm,enable_prefix_caching=true,enable_chunked_prefill=true"]
    before = side_findings(base, sides=sides)
    for code in ("prefix-caching", "chunked-prefill"):
        f = before[(code, "b")]
        flag = setting_words(f.setting["key"], f.setting["value"], "cli").removeprefix("--set ")
        assert flag.startswith("b.")  # the side's option, addressed by the side's name
        assert (code, "b") not in side_findings(base, flag, sides=sides)


# -- EOS -----------------------------------------------------------------------------------------

def test_eos_that_only_vllm_would_stop_on_is_a_warning(variant):
    model = variant(generation={"eos_token_id": 4})  # tokenizer and config.json say 2
    f = findings(model)["eos-mismatch"]
    assert f.severity == "warning"
    assert "vLLM would stop on [2, 4]" in f.message and "HF generate on [4]" in f.message
    assert "passes [4, 2] to every side" in f.message


def test_eos_sources_that_differ_but_engines_agree_is_info(variant):
    model = variant(generation={"eos_token_id": [2, 4]}, config={"eos_token_id": 4})
    f = findings(model)["eos-mismatch"]
    assert f.severity == "info"


def test_a_generation_config_without_eos_leaves_hf_alone_without_one(variant, tmp_path):
    # Both engines fall back to config.json's EOS only when generation_config.json is absent: a file
    # that names none leaves HF generate with none (it runs to max_new_tokens), vLLM with the tokenizer's.
    model = variant(generation={"eos_token_id": None})
    f = findings(model)["eos-mismatch"]
    assert f.severity == "warning"
    assert "vLLM would stop on [2]" in f.message and "HF generate on none" in f.message
    # No file at all: both read config.json's, which agrees with the tokenizer: nothing to say.
    (model / "generation_config.json").unlink()
    assert "eos-mismatch" not in findings(model)


def test_eos_mismatch_says_when_ignore_eos_makes_it_moot(variant):
    model = variant(generation={"eos_token_id": 4})
    assert "ignored: ignore_eos=true" in findings(model, "ignore_eos=true")["eos-mismatch"].message
    assert "ignored" not in findings(model)["eos-mismatch"].message


def test_a_side_whose_model_folder_declares_other_eos(base, variant):
    other = variant(generation={"eos_token_id": 4})
    found = side_findings(base, sides=["ref=hf", f"b=hf,model={other}"])
    f = found[("side-model-eos", "b")]
    assert f.severity == "info" and f.fix
    # Its folder's EOS (generation_config.json, then config.json) against the run's; the list every side
    # stops on stays the run's.
    assert "declares EOS [4, 2], the run's model [2]; every side stops on [2]" in f.message
    differ = found[("sides-differ", "b")].message
    assert "model folder" in differ and str(other) in differ
    # The same folder as the run's: nothing to say about its EOS, and the sides are the same setup.
    same = side_findings(base, sides=["ref=hf", f"b=hf,model={base}"])
    assert ("side-model-eos", "b") not in same and ("sides-identical-setup", "b") in same


# -- BOS -----------------------------------------------------------------------------------------

def test_template_that_writes_bos_for_a_bos_adding_tokenizer(base, variant):
    assert findings(base, "chat=true")["template-bos"].severity == "info"
    assert "template-bos" not in findings(base)  # no template applied
    no_bos = variant(template="{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
                              "{% endfor %}<|assistant|>\n")
    assert "template-bos" not in findings(no_bos, "chat=true")


def test_prompt_that_starts_with_bos_twice(base):
    f = findings(base, prompts=("<s>" + PROMPT, PROMPT))["double-bos"]
    assert f.severity == "warning" and "[0]" in f.message
    assert "double-bos" not in findings(base, "chat=true", prompts=("<s>" + PROMPT,))


# -- generation_config.json ----------------------------------------------------------------------

def test_generation_config_defaults_are_reported_as_neutralised(variant):
    f = findings(variant(generation=TRAP))["generation-config-defaults"]
    assert f.severity == "info"
    assert "do_sample=True" in f.message and "neutralises" in f.message
    assert "vLLM would apply ['temperature', 'top_k', 'repetition_penalty']" in f.message


def test_temperature_without_do_sample_is_applied_by_vllm_alone(variant):
    f = findings(variant(generation={"temperature": 0.6}))["generation-config-defaults"]
    assert "vLLM would apply ['temperature']" in f.message and "HF generate none" in f.message


def test_generation_config_model_says_what_hf_fills(variant):
    model = variant(generation=TRAP)
    greedy = findings(model, "generation_config=model")["generation-config-applied"]
    assert greedy.severity == "info" and "inert under greedy" in greedy.message
    assert greedy.setting == {"key": "generation_config", "value": "neutral"}
    sampled = findings(model, "generation_config=model", "temperature=0.9", "min_p=0",
                       "top_k=0")["generation-config-applied"]
    assert sampled.severity == "warning"
    assert "generation-config-defaults" not in findings(model, "generation_config=model")
    # The old spelling reaches the same check.
    assert "generation-config-applied" in findings(model, "vllm.generation_config=auto")


def test_one_side_taking_the_models_generation_config_is_named_with_its_own_fix(variant):
    f = findings(variant(generation=TRAP), sides=["ref=hf", "b=hf,generation_config=model"])["generation-config-applied"]
    assert f.side == "b" and f.setting == {"key": "b.generation_config", "value": "neutral"}


def test_generation_config_model_without_an_hf_side_has_nothing_to_fill(variant):
    found = findings(variant(generation=TRAP), "generation_config=model", sides=["a=vllm", "b=vllm"])
    assert "generation-config-applied" not in found and "generation-config-defaults" not in found


# -- sampling semantics --------------------------------------------------------------------------

def test_sampling_semantics(base):
    sampled = findings(base, "temperature=0.8")
    assert sampled["sampled-streams"].severity == "warning"
    assert "top_k=50" in sampled["top-k-off"].message
    both = findings(base, "temperature=0.8", "top_k=40", "top_p=0.9")
    assert "top-k-top-p-order" in both and "top-k-off" not in both
    assert "both apply top-k, then top-p" in both["top-k-top-p-order"].message and "min-p-order" not in both
    # min_p with top_p: vLLM applies min_p first, HF after: the kept sets differ (a warning).
    minp = findings(base, "temperature=0.8", "min_p=0.1", "top_p=0.9")
    assert minp["min-p-order"].severity == "warning" and "vLLM applies min_p first" in minp["min-p-order"].message
    assert "min-p-order" not in findings(base, "temperature=0.8", "min_p=0.1")
    assert "min-p-order" not in findings(base, "min_p=0.1", "top_p=0.9")  # greedy: no filter runs
    assert "greedy-ignores-filters" in findings(base, "top_k=5")
    assert "PROMPT" in findings(base, "repetition_penalty=1.2")["repetition-penalty"].message
    assert not {"sampled-streams", "top-k-off", "greedy-ignores-filters", "repetition-penalty"} & \
        set(findings(base))


# -- dtype and logits ----------------------------------------------------------------------------

def test_dtype_auto_on_a_float32_checkpoint(base, variant):
    found = findings(base, "dtype=auto")
    assert "to float32, for hf, vllm" in found["dtype-auto"].message
    assert "dtype-auto" not in findings(base)  # explicit float32
    bf16 = variant(config={"dtype": "bfloat16"})
    found = findings(bf16, "dtype=auto")
    assert "dtype-auto" not in found and "low-precision" in found


def test_dtype_auto_on_a_checkpoint_without_a_config_dtype_reads_its_weights(base, tmp_path):
    import json

    from tiny_models import build_model

    def dtype_less(folder):
        cfg = json.loads((folder / "config.json").read_text())
        for key in ("dtype", "torch_dtype"):
            cfg.pop(key, None)
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder

    # bfloat16 weights, no dtype in config.json: both engines load bfloat16, and so does 'auto' here.
    bf16 = dtype_less(build_model(tmp_path / "bf16", dtype="bfloat16"))
    p = prepared(bf16, "dtype=auto")
    assert p.model.config_dtype == "" and p.model.weights_dtype == "bfloat16"
    assert {s.dtype for s in p.sides} == {"bfloat16"}
    assert "dtype-auto" not in findings(bf16, "dtype=auto")
    # float32 weights: vLLM alone would downcast; parity-ui loads both in float32 and says so.
    f32 = dtype_less(build_model(tmp_path / "f32"))
    f = findings(f32, "dtype=auto")["dtype-auto"]
    assert "names no dtype and whose weights are float32" in f.message and "to float32, for hf, vllm" in f.message


def test_dtype_auto_names_only_the_sides_left_at_auto(base):
    f = findings(base, "dtype=auto", sides=["ref=hf,dtype=float32", "b=vllm"])["dtype-auto"]
    assert f.message.endswith("for b.")


def test_low_precision_on_every_side(base):
    f = findings(base, "dtype=bfloat16")["low-precision"]
    assert f.setting == {"key": "dtype", "value": "float32"} and "bfloat16" in f.message
    assert "sides-dtype-differ" not in findings(base, "dtype=bfloat16")


@pytest.mark.parametrize("preset", ["fp32-reference", "three-way"])
def test_sides_in_different_dtypes(base, preset):
    found = findings(base, base_cfg={"sides": SIDE_PRESETS[preset]})
    f = found["sides-dtype-differ"]
    assert f.severity == "info" and "ref float32" in f.message and "bfloat16" in f.message
    assert "low-precision" not in found  # not one dtype for every side


def test_fp32_logits_on_one_side_only_is_a_warning(base):
    found = side_findings(base, "dtype=bfloat16", sides=["ref=hf,fp32_logits=true", "b=vllm"])
    f = found[("fp32-logits-one-sided", "b")]
    assert f.severity == "warning"
    assert "on for ref only" in f.message and "(b)" in f.message
    assert f.setting == {"key": "b.fp32_logits", "value": True}


def test_fp32_logits_on_every_side_or_in_float32_is_fine(base):
    rl = findings(base, "dtype=bfloat16", base_cfg={"sides": SIDE_PRESETS["rl-rollout"]})
    assert "fp32-logits-one-sided" not in rl
    # float32 everywhere: the lm_head is float32 on both sides anyway.
    assert "fp32-logits-one-sided" not in findings(base, sides=["ref=hf,fp32_logits=true", "b=vllm"])


# -- RoPE and context ----------------------------------------------------------------------------

def test_rope_legacy_spelling(variant):
    model = variant(config={"rope_scaling": {"type": "linear", "factor": 2.0}})
    assert findings(model)["rope-legacy-type"].severity == "info"
    modern = variant(config={"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert "rope-legacy-type" not in findings(modern)


def test_rope_scaling_and_rope_parameters_that_disagree(variant):
    model = variant(config={"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                            "rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}})
    f = findings(model)["rope-conflict"]
    assert f.severity == "warning" and "uses rope_scaling and drops rope_parameters" in f.message
    same = variant(config={"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                           "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}})
    assert "rope-conflict" not in findings(same)


def test_rope_override_and_yarn(variant):
    model = variant(config={"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}})
    found = findings(model, "rope_scaling={rope_type: yarn, factor: 4.0}")
    assert "rope-override" in found and "rope-yarn" in found
    assert found["rope-override"].setting == {"key": "rope_scaling", "value": None}
    assert not {"rope-override", "rope-yarn"} & set(findings(model))


def test_prompt_longer_than_the_unscaled_context(variant):
    short = variant(config={"max_position_embeddings": 32})
    # HF sides only: a vLLM side refuses a max_model_len past the positions (tests/unit/test_context.py).
    found = findings(short, "max_new_tokens=40", "max_model_len=128", sides=["ref=hf", "b=hf"])
    assert found["context-over-unscaled"].severity == "warning"
    assert "no RoPE scaling" in found["context-over-unscaled"].message
    scaled = findings(short, "max_new_tokens=40", "rope_scaling={rope_type: linear, factor: 4.0}")
    assert "rest on the RoPE scaling" in scaled["context-over-unscaled"].message
    assert "context-over-unscaled" not in findings(short, "max_new_tokens=8")


# -- batching, caching, chunking -----------------------------------------------------------------

def test_batching_caching_chunking(base):
    assert "batch-size-unstable" in findings(base, f"batch_size={STABLE_BATCH_BOUND + 1}")
    assert "batch-size-unstable" not in findings(base, f"batch_size={STABLE_BATCH_BOUND}")
    assert "hf-left-padding" in findings(base, "batch_size=2", prompts=(PROMPT, "x = 1"))
    assert "hf-left-padding" not in findings(base, "batch_size=2")  # one prompt: no batch
    caching = findings(base, "vllm.enable_prefix_caching=true")["prefix-caching"]
    assert caching.side == "vllm" and caching.setting == {"key": "vllm.enable_prefix_caching", "value": False}
    chunked = findings(base, "vllm.enable_chunked_prefill=true")["chunked-prefill"]
    assert chunked.side == "vllm" and chunked.setting == {"key": "vllm.enable_chunked_prefill", "value": False}


def test_hf_left_padding_needs_an_hf_side(base):
    two_prompts = (PROMPT, "x = 1")
    assert "hf-left-padding" not in findings(base, "batch_size=2", prompts=two_prompts,
                                             base_cfg={"sides": SIDE_PRESETS["eager-vs-graphs"]})


def test_caching_and_chunking_are_found_per_side(base):
    found = side_findings(base, sides=["ref=vllm", "b=vllm,enable_prefix_caching=true",
                                       "c=vllm,enable_chunked_prefill=true"])
    assert ("prefix-caching", "b") in found and ("chunked-prefill", "c") in found
    assert not {("prefix-caching", "ref"), ("prefix-caching", "c"), ("chunked-prefill", "b")} & set(found)
    assert found[("prefix-caching", "b")].message.startswith("side b: ")


def test_batch_invariant_is_unsupported_on_cpu(base, monkeypatch):
    found = side_findings(base, sides=["ref=vllm", "inv=vllm,batch_invariant=true"])
    f = found[("batch-invariant-unsupported", "inv")]
    assert "CPU" in f.message and f.message.startswith("side inv: ")
    assert f.setting == {"key": "inv.batch_invariant", "value": False}
    assert ("batch-invariant-unsupported", "ref") not in found
    assert hardware.batch_invariant_support(False)[0] is False
    monkeypatch.setattr(hardware, "_BATCH_INVARIANT_MODULES", ("no/such/module.py",))
    ok, why = hardware.batch_invariant_support(True)
    assert not ok and "this vLLM" in why


# -- logprobs mode -------------------------------------------------------------------------------

def test_logprob_modes(base):
    mode = "logprobs_mode=processed_logprobs"
    assert findings(base, mode, "temperature=0.7")["processed-logprobs-sampling"].severity == "warning"
    assert findings(base, mode)["processed-logprobs"].severity == "info"
    assert findings(base, mode)["processed-logprobs"].setting == {"key": "logprobs_mode", "value": "raw_logprobs"}
    assert "raw-logprobs-processors" in findings(base, "repetition_penalty=1.1")
    assert not {"processed-logprobs", "processed-logprobs-sampling", "raw-logprobs-processors"} & \
        set(findings(base))


# -- what the sides differ in --------------------------------------------------------------------

def test_sides_with_the_same_setup(base):
    f = findings(base, sides=["a=vllm", "b=vllm"])["sides-identical-setup"]
    assert f.side == "b" and "same setup as the reference a" in f.message and "nondeterminism" in f.message
    assert f.fix


def test_sides_that_differ_in_an_option(base):
    f = findings(base, base_cfg={"sides": SIDE_PRESETS["eager-vs-graphs"]})["sides-differ"]
    assert f.side == "graphs"
    assert f.message == "side graphs differs from the reference eager, as configured, only in enforce_eager (True vs False)."


def test_sides_that_differ_only_in_settings_that_keep_the_tokens(base):
    # On the CPU plan, device auto is the CPU: the same kernels.
    f = findings(base, sides=["a=vllm", "b=vllm,device=cpu"])["sides-differ"]
    assert "only in settings that should not change its tokens (device ('auto' vs 'cpu'))" in f.message


def test_scheduling_settings_are_a_difference_unless_both_sides_are_batch_invariant(base, monkeypatch):
    # max_num_seqs and the KV cache's size change which requests share a batch: on an engine that is
    # not batch invariant (vLLM-CPU never is) that changes bits, so they are not called inert.
    f = findings(base, sides=["a=vllm", "b=vllm,gpu_memory_utilization=0.3,max_num_seqs=2"])["sides-differ"]
    assert "should not change" not in f.message
    assert "only in scheduling: gpu_memory_utilization (default vs 0.3), max_num_seqs (default vs 2), which " \
           "change which requests share a batch" in f.message
    # Both sides batch invariant where that mode is in effect: the same settings keep the tokens.
    monkeypatch.setattr(preflight, "batch_invariant_support", lambda gpu: (True, "supported"))
    p = prepared(base, sides=["a=vllm,batch_invariant=true", "b=vllm,batch_invariant=true,max_num_seqs=2"])
    (f,) = [f for f in preflight.check_side_differences(p) if f.side == "b"]
    assert "only in settings that should not change its tokens (max_num_seqs (default vs 2))" in f.message
    # One side batch invariant and one not: a difference (and batch_invariant itself is named).
    p = prepared(base, sides=["a=vllm", "b=vllm,batch_invariant=true,max_num_seqs=2"])
    (f,) = [f for f in preflight.check_side_differences(p) if f.side == "b"]
    assert "batch_invariant (False vs True)" in f.message and "scheduling: max_num_seqs" in f.message


def test_a_side_on_the_cpu_against_one_on_a_gpu_is_a_difference_not_inert(base):
    # The CPU plan cannot resolve a GPU; the check reads only the plan's on_gpu, so a GPU plan is that flag.
    import dataclasses

    def on_gpu(sides):
        p = prepared(base, sides=sides)
        p = dataclasses.replace(p, resolved=dataclasses.replace(p.resolved, on_gpu=True))
        (f,) = [f for f in preflight.check_side_differences(p) if f.side == "b"]
        return f.message

    assert "only in device (1 GPU vs the CPU)" in on_gpu(["a=hf", "b=hf,device=cpu"])
    assert "only in device (1 GPU vs 2 GPUs)" in on_gpu(["a=hf,device=cuda:0", "b=hf,device=cuda:0,1"])
    assert "should not change its tokens (device ('auto' vs 'cuda:1'))" in on_gpu(["a=hf", "b=hf,device=cuda:1"])


def test_an_option_left_unset_reads_as_the_engines_default_not_pythons_none(base):
    f = findings(base, sides=["a=hf", "b=hf,cpu_threads=1"])["sides-differ"]
    assert "cpu_threads (default vs 1)" in f.message and "None" not in f.message


def test_every_side_is_described_against_the_reference(base):
    found = side_findings(base, sides=["ref=hf", "b=vllm", "c=vllm,batch_invariant=true,enforce_eager=true",
                                       "d=hf,attn_implementation=eager"])
    assert {side for code, side in found if code.startswith("sides-")} == {"b", "c", "d"}
    assert "engine (hf vs vllm)" in found[("sides-differ", "b")].message
    d = found[("sides-differ", "d")].message
    assert "attn_implementation ('auto' vs 'eager')" in d and "engine" not in d


def test_a_side_in_another_environment(base):
    here = Path(sys.executable)
    other = next((p for p in (here.with_name("python3"), here.with_name(f"python3.{sys.version_info[1]}"))
                  if p.is_file() and str(p) != str(here)), None)
    if other is None:
        pytest.skip("no second spelling of this interpreter to stand for another environment")
    found = side_findings(base, sides=["a=vllm", f"b=vllm,python={other},batch_invariant=true"])
    msg = found[("sides-differ", "b")].message
    assert f"environment (this one vs {other})" in msg
    # batch_invariant is checked by the side's own worker, in its own environment, not here.
    assert ("batch-invariant-unsupported", "b") not in found


def test_sides_of_two_kinds_that_differ_in_a_shared_option(base):
    f = findings(base, sides=["ref=hf,fp32_logits=true", "b=vllm"])["sides-differ"]
    assert "fp32_logits" in f.message


def test_a_side_dtype_equal_to_the_runs_is_no_difference(base):
    found = findings(base, "dtype=float32", sides=["a=vllm,dtype=float32", "b=vllm"])
    assert "sides-differ" not in found, found["sides-differ"].message
    assert found["sides-identical-setup"].side == "b"


def test_findings_are_sorted_warnings_first(variant):
    model = variant(generation={"eos_token_id": 4})
    prep = prepared(model, "dtype=auto")
    sev = [f.severity for f in preflight.run_preflight(prep)]
    assert sev == sorted(sev, key=["error", "warning", "info"].index) and "warning" in sev and "info" in sev


def test_a_warm_worker_is_reused_when_only_sampling_settings_change(base):
    """The load key: what a worker must have loaded. Sampling travels with each request."""
    keys = {p.name: p.load_key for p in prepared(base).sides}
    other = {p.name: p.load_key for p in prepared(base, "max_new_tokens=8", "temperature=0.7", "top_p=0.9").sides}
    assert keys == other
    reloaded = {p.name: p.load_key for p in prepared(base, "dtype=bfloat16").sides}
    assert all(reloaded[n] != keys[n] for n in keys)
    seeded = {p.name: p.load_key for p in prepared(base, "seed=7").sides}
    assert seeded["hf"] != keys["hf"]  # HF seeds its generator from the load arguments


def test_a_logprobs_mode_mismatch_between_sides_is_named_as_a_trap(base):
    sides = ["trainer=hf", "rollout=vllm,logprobs_mode=processed_logprobs"]
    found = findings(base, "temperature=1", "top_p=0.8", sides=sides)
    f = found["logprobs-mode-mismatch"]
    assert f.severity == "warning" and f.side == "rollout"
    assert "rollout report processed logprobs" in f.message and "trainer raw" in f.message
    assert "log S" in f.message and f.setting == {"key": "rollout.logprobs_mode", "value": "raw_logprobs"}
    # Greedy: no gap yet, and the finding says what would put one there.
    assert "any temperature" in findings(base, sides=sides)["logprobs-mode-mismatch"].message
    assert "logprobs-mode-mismatch" not in findings(base, "temperature=1", "top_p=0.8")
    # Greedy with a repetition penalty: processed logprobs are after it, so they do not agree.
    pen = findings(base, "repetition_penalty=1.2", sides=sides)["logprobs-mode-mismatch"].message
    assert "after repetition_penalty=1.2" in pen and "the two agree" not in pen


def test_shared_seed_is_said_and_at_temperature_0_is_greedy(base):
    found = findings(base, "sampling=shared-seed", "temperature=1")
    assert "shared-seed" in found and "sampled-streams" not in found
    assert "same Gumbel noise" in found["shared-seed"].message
    found = findings(base, "sampling=shared-seed", "temperature=0")
    assert "greedy" in found["shared-seed-greedy"].message and "shared-seed" not in found
