"""Determinism probes and setting sweeps on real engines with one shared service; the sweep addresses a
side's option by the side's name. The pure parts on hand-built data are tests/unit/test_probes_sweep.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from parity_ui.core.config import build_config
from parity_ui.commands.probes import run_probe
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.store.runs import get_run, list_runs
from parity_ui.commands.sweep import parse_grid, run_sweep, summarize_sweep
from parity_ui.core.types import to_dict

PROMPT = "def main(args):"


@pytest.fixture(scope="module")
def model(tiny_llama) -> Path:
    return tiny_llama


def test_probe_counts_outputs_per_side_and_mode(service, model):
    cfg = build_config(overrides=["dtype=float32", "max_new_tokens=12"], sides=["ref=hf", "b=vllm"])
    run = run_probe(service, str(model), PromptSpec(text=PROMPT), cfg, n=2, batch=3)
    assert run.status in ("ok", "diverged"), run.error
    stored = get_run(service.db, run.id)
    assert stored.kind == "probe" and stored.probes == run.probes
    assert [s.name for s in stored.sides] == ["ref", "b"] and stored.side("b").version
    p = to_dict(run.probes)  # the report as stored
    assert (p["n"], p["batch"]) == (2, 3)
    for side in ("ref", "b"):
        for mode, runs in (("alone", 2), ("batched", 2), ("alone_vs_batched", 3)):
            s = p["sides"][side][mode]
            assert s["runs"] == runs and 1 <= s["distinct"] <= runs and sum(s["counts"]) == runs
            assert (s["distinct"] == 1) == (s["first_fork"] is None)
        # the same prompt alone, twice, on the same warm engine, in float32: the same tokens
        assert p["sides"][side]["alone"]["distinct"] == 1
        assert run.prompts[0].results[side].token_ids
    bi = p["batch_invariant"]
    assert bi["supported"] == ("b+batch_invariant" in p["sides"])
    if not service.on_gpu:
        assert not bi["supported"] and "CPU" in bi["detail"]
    assert (run.status == "ok") == all(e[m]["distinct"] == 1 for e in p["sides"].values()
                                       for m in ("alone", "batched", "alone_vs_batched"))


def test_sweep_stores_one_run_per_point_in_one_group(service, model):
    grid = parse_grid(["batch_size=1,2"])
    sweep = run_sweep(service, str(model), PromptSpec(text=PROMPT), grid,
                      overrides=["dtype=float32", "max_new_tokens=12", "cross_score=false"])
    runs = list_runs(service.db, group_id=sweep.group_id)
    assert sorted(r.id for r in runs) == sorted(p.run.id for p in sweep.points) and len(runs) == 2
    assert {r.kind for r in runs} == {"sweep"}
    assert [len(p.run.prompts) for p in sweep.points] == [1, 2]  # batch_size=2 really batches
    summary = summarize_sweep(sweep)
    (effect,) = summary["effects"]
    fds = effect["first_divergence_by_value"]
    assert fds == {"1": [sweep.points[0].run.first_divergence], "2": [sweep.points[1].run.first_divergence]}
    assert effect["moves_divergence"] == (fds["1"] != fds["2"])


def test_sweep_addresses_a_side_option_by_the_sides_name(service, model):
    grid = parse_grid(["b.dtype=float32,bfloat16"])
    sweep = run_sweep(service, str(model), PromptSpec(text=PROMPT), grid, sides=["ref=hf,dtype=float32", "b=vllm"],
                      overrides=["max_new_tokens=64", "ignore_eos=true", "cross_score=false"])
    assert [p.settings for p in sweep.points] == [{"b.dtype": "float32"}, {"b.dtype": "bfloat16"}]
    assert [p.run.side("b").dtype for p in sweep.points] == ["float32", "bfloat16"]
    assert [p.run.side("ref").dtype for p in sweep.points] == ["float32", "float32"]
    assert sweep.points[0].run.status == "ok" and sweep.points[1].run.status == "diverged"
    (effect,) = summarize_sweep(sweep)["effects"]
    assert effect["key"] == "b.dtype" and effect["moves_divergence"] is True
