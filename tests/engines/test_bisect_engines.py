"""parity bisect with real engines (vLLM CPU build, transformers) and planted causes, on the tiny
models: a dtype difference among harmless ones, a perturbed checkpoint needed together with a dtype
difference, the generation_config.json trap on one side, a flag that does not take effect. Three
prompts, 16 tokens; the session service keeps the reference's worker warm across trials."""
from __future__ import annotations

import json

import pytest

from parity_ui.commands.setting_bisect import BisectRequest, bisect_run
from parity_ui.core.bisect_record import APPLIED, DIVERGES, FOUND, NO_VISIBLE_DIFFERENCE, RESTORES
from parity_ui.core.config import build_config
from parity_ui.run.prepare import RunRequest
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.store.runs import get_run


PROMPTS = [PromptSpec(text="def parse_args(self, args=None, namespace=None):"),
           PromptSpec(text="import os\nimport sys\n\nclass Path:"),
           PromptSpec(text="The quick brown fox")]
SETTINGS = ["dtype=float32", "max_new_tokens=16", "ignore_eos=true"]


def _compare(service, model, *sides):
    return service.run(RunRequest(model=str(model), prompts=list(PROMPTS),
                                  config=build_config(None, SETTINGS, sides=list(sides))))


def _bisect(service, run):
    b = bisect_run(service, BisectRequest(run.id, prompts=3))
    assert get_run(service.db, b.id).bisect == b.bisect  # stored as it ended
    return b, b.bisect


def _trial(r, *flipped):
    return next(t for t in r.trials if set(t.flipped) == set(flipped))


@pytest.fixture(scope="module")
def dtype_search(service, tiny_llama):
    """vLLM float32 reference; b in bfloat16 with prefix caching, max_num_seqs and async scheduling,
    which the CPU build turns off whatever is asked."""
    run = _compare(service, tiny_llama, "ref=vllm",
                   "b=vllm,dtype=bfloat16,enable_prefix_caching=true,max_num_seqs=4,async_scheduling=true")
    assert run.status in ("ok", "diverged"), run.error
    return _bisect(service, run)


def test_a_dtype_difference_among_harmless_ones_is_named_alone(service, dtype_search):
    b, r = dtype_search
    assert b.status == "ok" and r.outcome == FOUND, b.error
    assert r.culprit == ["dtype"] and r.needed == ["dtype"]
    assert {f.key for f in r.factors} == {"dtype", "enable_prefix_caching", "max_num_seqs", "async_scheduling"}
    base, alone = _trial(r), _trial(r, "dtype")
    # 3 prompts: the floor's own figures are noisy, so the verdict may be "too few prompts to tell"
    # (issue 33 item 7); either way the trial does not restore parity
    assert base.outcome == DIVERGES and base.oracle == "noise floor" and \
        base.verdict in ("exceeds noise", "too few prompts to tell")
    assert alone.outcome == RESTORES and alone.oracle == "identical tokens" and alone.identical == 3
    assert r.trials[1].warm  # every setting flipped is the reference's own setup: its worker is warm
    # The flips that vLLM reports did take effect in the trial sides' resolved settings.
    checks = {c.key: c for t in r.trials for c in t.checks}
    assert checks["dtype"].status == checks["enable_prefix_caching"].status == checks["max_num_seqs"].status == APPLIED
    for t in r.trials:
        run = get_run(service.db, t.run_id, prompts=[])
        trial = run.side("b")
        assert trial.resolved["dtype"] == ("float32" if "dtype" in t.flipped else "bfloat16")
        assert trial.resolved["prefix_caching"] is ("enable_prefix_caching" not in t.flipped)


def test_a_flag_that_does_not_take_effect_is_reported(dtype_search):
    b, r = dtype_search
    f = next(f for f in r.factors if f.key == "async_scheduling")
    assert f.resolved == {"reference": False, "side": False} and "did not take effect" in f.note
    (doubt,) = [c for c in r.unconfirmed() if c.key == "async_scheduling"]
    assert doubt.status == NO_VISIBLE_DIFFERENCE and "did not take effect" in doubt.message


def test_a_perturbed_checkpoint_and_a_dtype_needed_together_are_named_as_the_pair(service, tiny_llama, tmp_path):
    from tiny_models import copy_model, perturb_weights

    other = perturb_weights(copy_model(tiny_llama, tmp_path / "perturbed"), "model.layers.1.mlp.down_proj.weight",
                            scale=1.0)
    # HF sides: a worker starts in a few seconds, where each vLLM trial side would start its own engine.
    run = _compare(service, tiny_llama, "ref=hf", f"b=hf,dtype=bfloat16,model={other}")
    b, r = _bisect(service, run)
    assert b.status == "ok" and r.outcome == FOUND, b.error
    assert r.culprit == ["dtype", "model"] and r.needed == ["dtype", "model"]
    assert _trial(r, "dtype").outcome == DIVERGES and _trial(r, "dtype").oracle == "identical tokens"
    assert _trial(r, "model").outcome == DIVERGES and _trial(r, "dtype", "model").outcome == RESTORES
    assert "needed together" in r.summary
    (check,) = [c for c in _trial(r, "model").checks if c.key == "model"]
    assert check.status == APPLIED and check.resolved != str(other)


def test_the_generation_config_trap_on_one_side_is_named(service, tiny_llama, tmp_path):
    """HF against HF, the second side applying the model's generation_config.json (which suppresses a
    token the model picks): generation_config names it; device=cpu, harmless here, is left out."""
    from tiny_models import copy_model

    model = copy_model(tiny_llama, tmp_path / "trap")
    plain = _compare(service, model, "ref=hf", "b=hf")
    assert plain.status == "ok", plain.error
    picked = plain.prompts[0].results["ref"].token_ids[2]
    path = model / "generation_config.json"
    gen = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**gen, "suppress_tokens": [picked]}))
    run = _compare(service, model, "ref=hf", "b=hf,generation_config=model,device=cpu")
    assert run.status == "diverged", run.error
    b, r = _bisect(service, run)
    assert b.status == "ok" and r.culprit == ["generation_config"], b.error
    assert {f.key for f in r.factors} == {"generation_config", "device"}
    (check,) = [c for c in _trial(r, "generation_config").checks if c.key == "generation_config"]
    assert check.status == APPLIED and check.resolved == "neutral"
    assert _trial(r).first_divergence is not None and _trial(r).first_divergence <= 2
