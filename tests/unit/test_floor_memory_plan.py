"""Issue 33 item 2: the noise floor's side is resident with the others, so the GPU memory plan counts
it: the stored plan line names every side, and a floor that does not fit is refused, naming the floor,
before anything loads. A simulated GPU (memory_plan.gpus patched), no engine."""
from __future__ import annotations

import pytest

from parity_ui.commands.workload.run import floor_plan
from parity_ui.core.config import build_config
from parity_ui.core.errors import ConfigError
from parity_ui.core.workload_record import WorkloadOptions
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run import memory_plan
from parity_ui.run.prepare import RunRequest, prepare

GIB = 2**30


@pytest.fixture(scope="module")
def model(build_tiny):
    return build_tiny("m", arch="llama", max_position_embeddings=4096, num_hidden_layers=2, num_key_value_heads=4,
                      head_dim=64)


def _gpu(monkeypatch, gib: float, hf_gib: float | None = None):
    monkeypatch.setattr(memory_plan, "gpus", lambda: [{"index": "0", "name": "test", "memory_mib": str(int(gib * 1024)),
                                                       "compute_cap": "9.0"}])
    if hf_gib is not None:  # an 8B-sized HF side: its weights and working memory, whatever the tiny model is
        monkeypatch.setattr(memory_plan, "hf_bytes", lambda *a, **k: int(hf_gib * GIB))


def _prepare(model, sides, *overrides):
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=8", *overrides], sides=sides)
    return prepare(RunRequest(model=str(model), prompts=[PromptSpec(text="def main(args):")], config=cfg), True)


def _plan_line(prep) -> str:
    lines = [w.message for w in prep.warnings if w.code == "memory-plan"]
    assert len(lines) == 1
    return lines[0]


def test_the_floor_side_is_in_the_plan_line_the_run_stores(model, monkeypatch):
    _gpu(monkeypatch, 80, hf_gib=14)
    prep = _prepare(model, ["ref=hf", "b=vllm"])
    stored = prep.warnings  # what RunRecorder.prepared() keeps as run.warnings: the same list
    assert "floor" not in _plan_line(prep)
    floor, spec = floor_plan(prep, WorkloadOptions(mode="scored", floor="kernel"))
    assert spec.side == floor.name == "floor"
    line = _plan_line(prep)
    assert prep.warnings is stored  # replaced in place: the stored line is the new one
    assert all(f"{n} " in line for n in ("ref", "b", "floor")), line
    assert "ref 14.0 GiB" in line and "floor 14.0 GiB" in line
    # the vLLM side's unset share is what the two HF copies leave (capped at half the GPU)
    assert prep.side("b").args.llm["gpu_memory_utilization"] <= memory_plan.HEADROOM - 28 / 80


def test_a_floor_that_does_not_fit_is_refused_naming_the_floor_before_anything_loads(model, monkeypatch):
    # A 14B-sized model on an 80 GB card: the HF reference (30 GiB) and vLLM (14 GiB of weights) fit, a
    # second HF copy (the floor) leaves vLLM less than its weights.
    _gpu(monkeypatch, 80, hf_gib=30)
    monkeypatch.setattr(memory_plan, "weight_bytes", lambda plan: 14 * GIB)
    prep = _prepare(model, ["ref=hf", "b=vllm"])
    assert prep.side("b").args.llm["gpu_memory_utilization"] > 0
    with pytest.raises(ConfigError) as e:
        floor_plan(prep, WorkloadOptions(mode="scored", floor="kernel"))
    err = e.value
    assert err.key == "floor" and "noise floor" in err.message and "does not fit" in err.message
    assert "--floor none" in err.fix
    # without a floor the same run is fine
    assert floor_plan(prep, WorkloadOptions(mode="scored", floor="none"))[0] is None


def test_two_hf_copies_that_cannot_share_the_card_are_refused_too(model, monkeypatch):
    _gpu(monkeypatch, 80, hf_gib=30)  # ref + b fit (60 of 73.6 GiB), a third HF copy does not
    prep = _prepare(model, ["ref=hf", "b=hf,sdpa_kernels=math"])
    with pytest.raises(ConfigError) as e:
        floor_plan(prep, WorkloadOptions(mode="free", floor="order"))
    assert e.value.key == "floor" and "80 GiB" in e.value.message


def test_the_math_kernel_floor_counts_its_attention_scores(model, monkeypatch):
    _gpu(monkeypatch, 80)
    prep = _prepare(model, ["ref=hf", "b=vllm"])
    floor, _ = floor_plan(prep, WorkloadOptions(mode="scored", floor="kernel"))
    assert floor.spec.options.sdpa_kernels == "math"
    tokens = len(prep.prompts[0].token_ids) + 8
    assert memory_plan.attention_scores_bytes(floor, tokens, 1) == 2 * floor.model.num_attention_heads * tokens ** 2 * 4
    assert memory_plan.attention_scores_bytes(prep.reference, tokens, 1) == 0
