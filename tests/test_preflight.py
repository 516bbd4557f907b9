"""Preflight checks: each one triggered by a model folder or config built for it, and not by a clean one.

Fast: `ParityService.prepare` loads only the tokenizer; model folders are one tiny model copied and
edited (config.json, generation_config.json, chat template). One engine test at the end shows the
findings reaching a stored run and the CLI JSON.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from parity_ui import preflight
from parity_ui.config import build_config
from parity_ui.preflight import STABLE_BATCH_BOUND, run_preflight
from parity_ui.prompts import PromptSpec
from parity_ui.service import ParityService, RunRequest

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_model  # noqa: E402

PROMPT = "def main(args):"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("pre") / "base")


@pytest.fixture(scope="module")
def service():
    s = ParityService(db_path=":memory:")
    yield s
    s.close()


@pytest.fixture
def variant(base, tmp_path):
    """A copy of the base model with edited JSON files (no weights are read by preflight)."""
    def make(config: dict | None = None, generation: dict | None = None, template: str | None = None,
             drop: tuple[str, ...] = ()) -> Path:
        folder = tmp_path / f"v{len(list(tmp_path.iterdir()))}"
        shutil.copytree(base, folder)
        for name, edit in (("config.json", config), ("generation_config.json", generation)):
            if edit is not None:
                data = json.loads((folder / name).read_text())
                for k, v in edit.items():
                    if v is None:
                        data.pop(k, None)
                    else:
                        data[k] = v
                (folder / name).write_text(json.dumps(data))
        if template is not None:
            (folder / "chat_template.jinja").write_text(template)
        for key in drop:
            data = json.loads((folder / "config.json").read_text())
            data.pop(key, None)
            (folder / "config.json").write_text(json.dumps(data))
        return folder
    return make


def findings(service, model, *overrides, prompts=(PROMPT,)):
    cfg = build_config(overrides=["dtype=float32", *overrides])
    prep = service.prepare(RunRequest(model=str(model), prompts=[PromptSpec(text=p) for p in prompts], config=cfg))
    return {f.code: f for f in run_preflight(prep, cfg)}


def test_a_clean_model_and_config_give_no_findings(service, base):
    assert findings(service, base) == {}


def test_every_finding_has_a_message_and_a_fix(service, variant):
    model = variant(generation={"do_sample": True, "temperature": 0.7, "eos_token_id": [2, 4]})
    found = findings(service, model, "temperature=0.5", "batch_size=20", "vllm.enable_prefix_caching=true",
                     "chat=true", prompts=(PROMPT, "x"))
    assert len(found) >= 6
    for f in found.values():
        assert f.severity in ("info", "warning", "error") and f.message and f.fix
        assert "\n" not in f.message


# -- EOS -----------------------------------------------------------------------------------------

def test_eos_that_only_vllm_would_stop_on_is_a_warning(service, variant):
    model = variant(generation={"eos_token_id": 4})  # tokenizer and config.json say 2
    f = findings(service, model)["eos-mismatch"]
    assert f.severity == "warning"
    assert "vLLM would stop on [2, 4]" in f.message and "HF generate on [4]" in f.message
    assert "passes [4, 2] to both" in f.message


def test_eos_sources_that_differ_but_engines_agree_is_info(service, variant):
    model = variant(generation={"eos_token_id": [2, 4]}, config={"eos_token_id": 4})
    f = findings(service, model)["eos-mismatch"]
    assert f.severity == "info"


# -- BOS -----------------------------------------------------------------------------------------

def test_template_that_writes_bos_for_a_bos_adding_tokenizer(service, base, variant):
    assert findings(service, base, "chat=true")["template-bos"].severity == "info"
    assert "template-bos" not in findings(service, base)  # no template applied
    no_bos = variant(template="{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
                              "{% endfor %}<|assistant|>\n")
    assert "template-bos" not in findings(service, no_bos, "chat=true")


def test_prompt_that_starts_with_bos_twice(service, base):
    f = findings(service, base, prompts=("<s>" + PROMPT, PROMPT))["double-bos"]
    assert f.severity == "warning" and "[0]" in f.message
    assert "double-bos" not in findings(service, base, "chat=true", prompts=("<s>" + PROMPT,))


# -- generation_config.json ----------------------------------------------------------------------

TRAP = {"do_sample": True, "temperature": 0.7, "top_k": 20, "repetition_penalty": 1.3}


def test_generation_config_defaults_are_reported_as_neutralised(service, variant):
    f = findings(service, variant(generation=TRAP))["generation-config-defaults"]
    assert f.severity == "info"
    assert "do_sample=True" in f.message and "neutralises" in f.message
    assert "vLLM would apply ['temperature', 'top_k', 'repetition_penalty']" in f.message


def test_temperature_without_do_sample_is_applied_by_vllm_alone(service, variant):
    f = findings(service, variant(generation={"temperature": 0.6}))["generation-config-defaults"]
    assert "vLLM would apply ['temperature']" in f.message and "HF generate none" in f.message


def test_generation_config_auto_says_what_hf_fills(service, variant):
    model = variant(generation=TRAP)
    greedy = findings(service, model, "vllm.generation_config=auto")["generation-config-applied"]
    assert greedy.severity == "info" and "inert under greedy" in greedy.message
    sampled = findings(service, model, "vllm.generation_config=auto", "temperature=0.9", "min_p=0",
                       "top_k=0")["generation-config-applied"]
    assert sampled.severity == "warning"
    assert "generation-config-defaults" not in findings(service, model, "vllm.generation_config=auto")


# -- sampling semantics --------------------------------------------------------------------------

def test_sampling_semantics(service, base):
    sampled = findings(service, base, "temperature=0.8")
    assert sampled["sampled-streams"].severity == "warning"
    assert "top_k=50" in sampled["top-k-off"].message
    both = findings(service, base, "temperature=0.8", "top_k=40", "top_p=0.9")
    assert "top-k-top-p-order" in both and "top-k-off" not in both
    assert "greedy-ignores-filters" in findings(service, base, "top_k=5")
    assert "PROMPT" in findings(service, base, "repetition_penalty=1.2")["repetition-penalty"].message
    assert not {"sampled-streams", "top-k-off", "greedy-ignores-filters", "repetition-penalty"} & \
        set(findings(service, base))


# -- dtype ---------------------------------------------------------------------------------------

def test_dtype_auto_on_a_float32_checkpoint(service, base, variant):
    found = findings(service, base, "dtype=auto")
    assert "to float32, for both" in found["dtype-auto"].message
    assert "dtype-auto" not in findings(service, base)  # explicit float32
    bf16 = variant(config={"dtype": "bfloat16"})
    found = findings(service, bf16, "dtype=auto")
    assert "dtype-auto" not in found and "low-precision" in found


# -- RoPE and context ----------------------------------------------------------------------------

def test_rope_legacy_spelling(service, variant):
    model = variant(config={"rope_scaling": {"type": "linear", "factor": 2.0}})
    assert findings(service, model)["rope-legacy-type"].severity == "info"
    modern = variant(config={"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert "rope-legacy-type" not in findings(service, modern)


def test_rope_scaling_and_rope_parameters_that_disagree(service, variant):
    model = variant(config={"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                            "rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}})
    assert findings(service, model)["rope-conflict"].severity == "warning"
    same = variant(config={"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                           "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}})
    assert "rope-conflict" not in findings(service, same)


def test_rope_override_and_yarn(service, variant):
    model = variant(config={"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}})
    found = findings(service, model, "rope_scaling={rope_type: yarn, factor: 4.0}")
    assert "rope-override" in found and "rope-yarn" in found
    assert not {"rope-override", "rope-yarn"} & set(findings(service, model))


def test_prompt_longer_than_the_unscaled_context(service, variant):
    short = variant(config={"max_position_embeddings": 32})
    found = findings(service, short, "max_new_tokens=40", "max_model_len=128")
    assert found["context-over-unscaled"].severity == "warning"
    assert "no RoPE scaling" in found["context-over-unscaled"].message
    scaled = findings(service, short, "max_new_tokens=40", "rope_scaling={rope_type: linear, factor: 4.0}")
    assert "rest on the RoPE scaling" in scaled["context-over-unscaled"].message
    assert "context-over-unscaled" not in findings(service, short, "max_new_tokens=8")


# -- batching, caching, chunking -----------------------------------------------------------------

def test_batching_caching_chunking(service, base):
    assert "batch-size-unstable" in findings(service, base, f"batch_size={STABLE_BATCH_BOUND + 1}")
    assert "batch-size-unstable" not in findings(service, base, f"batch_size={STABLE_BATCH_BOUND}")
    assert "hf-left-padding" in findings(service, base, "batch_size=2", prompts=(PROMPT, "x = 1"))
    assert "hf-left-padding" not in findings(service, base, "batch_size=2")  # one prompt: no batch
    assert "prefix-caching" in findings(service, base, "vllm.enable_prefix_caching=true")
    assert "chunked-prefill" in findings(service, base, "vllm.enable_chunked_prefill=true")


def test_batch_invariant_is_unsupported_on_cpu(service, base, monkeypatch):
    from parity_ui import probes

    f = findings(service, base, "vllm.batch_invariant=true")["batch-invariant-unsupported"]
    assert "CPU" in f.message
    assert probes.batch_invariant_support(False)[0] is False
    monkeypatch.setattr(probes, "_BATCH_INVARIANT_MODULES", ("no/such/module.py",))
    ok, why = probes.batch_invariant_support(True)
    assert not ok and "this vLLM" in why


# -- logprobs mode -------------------------------------------------------------------------------

def test_logprob_modes(service, base):
    mode = "vllm.logprobs_mode=processed_logprobs"
    assert findings(service, base, mode, "temperature=0.7")["processed-logprobs-sampling"].severity == "warning"
    assert findings(service, base, mode)["processed-logprobs"].severity == "info"
    assert "raw-logprobs-processors" in findings(service, base, "repetition_penalty=1.1")
    assert not {"processed-logprobs", "processed-logprobs-sampling", "raw-logprobs-processors"} & \
        set(findings(service, base))


def test_findings_are_sorted_warnings_first(service, variant):
    model = variant(generation={"eos_token_id": 4})
    cfg = build_config(overrides=["dtype=auto"])
    prep = service.prepare(RunRequest(model=str(model), prompts=[PromptSpec(text=PROMPT)], config=cfg))
    sev = [f.severity for f in preflight.run_preflight(prep, cfg)]
    assert sev == sorted(sev, key=["error", "warning", "info"].index) and "warning" in sev and "info" in sev


# -- the findings reach a real run ----------------------------------------------------------------

@pytest.mark.engines
def test_trap_model_findings_reach_the_stored_run_and_neutralised_defaults_keep_parity(variant, tmp_path):
    """A model whose generation_config.json asks for sampling and a different EOS: the run is still
    greedy and identical in float32 (parity-ui neutralises both), and says why in `warnings`."""
    from parity_ui.cli import run_json
    from parity_ui.store import get_run

    model = variant(generation={**TRAP, "eos_token_id": 4})
    svc = ParityService(db_path=str(tmp_path / "runs.db"))
    try:
        cfg = build_config(overrides=["dtype=float32", "max_new_tokens=12", "chat=true", "cross_score=false"])
        run = svc.run(RunRequest(model=str(model), prompts=[PromptSpec(text=PROMPT)], config=cfg))
    finally:
        svc.close()
    assert run.status == "ok", run.error
    codes = {w.code for w in run.warnings}
    assert {"generation-config-defaults", "eos-mismatch", "template-bos"} <= codes
    stored = get_run(svc.db, run.id)
    out = run_json(stored)
    assert {w["code"] for w in out["warnings"]} == codes
    assert out["explanation"]["verdict"] == "identical"
