"""Preflight's findings reach a real run: a model whose generation_config.json asks for sampling and another
EOS is still run greedy and identical in float32, and the stored run and its JSON say why. The checks
themselves, which load no engine, are tests/unit/test_preflight.py."""
from __future__ import annotations

from parity_ui.core.config import build_config
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.service import ParityService, RunRequest
from preflight_models import PROMPT, TRAP, base, variant  # noqa: F401  (base, variant: fixtures)


def test_trap_model_findings_reach_the_stored_run_and_neutralised_defaults_keep_parity(variant, tmp_path):
    """A model whose generation_config.json asks for sampling and a different EOS: the run is still
    greedy and identical in float32 (parity-ui neutralises both), and says why in `warnings`."""
    from parity_ui.render.report import run_json
    from parity_ui.store.runs import get_run

    model = variant(generation={**TRAP, "eos_token_id": 4})
    svc = ParityService(db_path=str(tmp_path / "runs.db"))
    try:
        cfg = build_config(overrides=["dtype=float32", "max_new_tokens=12", "chat=true", "cross_score=false"])
        run = svc.run(RunRequest(model=str(model), prompts=[PromptSpec(text=PROMPT)], config=cfg))
        stored = get_run(svc.db, run.id)
    finally:
        svc.close()
    assert run.status == "ok", run.error
    codes = {w.code for w in run.warnings}
    assert {"generation-config-defaults", "eos-mismatch", "template-bos", "sides-differ"} <= codes
    out = run_json(stored)
    assert {w["code"] for w in out["warnings"]} == codes
    assert [c["explanation"]["verdict"] for c in out["comparisons"]] == ["identical"]
