"""Determinism probes and setting sweeps: the pure parts on hand-built data, then both on real engines
with one shared service; the sweep addresses a side's option by the side's name."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity_ui.cli import main
from parity_ui.core.config import build_config
from parity_ui.core.errors import ConfigError
from parity_ui.commands.probes import companions, first_fork, run_probe, summarize_outputs
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.store.runs import get_run, list_runs, open_db
from parity_ui.commands.sweep import (MAX_POINTS, Sweep, SweepPoint, grid_points, parse_grid, run_sweep,
                             summarize_sweep)
from parity_ui.core.findings import cross_scores_from_json, explanation_from_json
from parity_ui.core.types import Comparison, ModelInfo, PromptResult, Run, SideInfo, to_dict

PROMPT = "def main(args):"


# -- pure parts ------------------------------------------------------------------------------------

def test_first_fork_and_summary():
    assert first_fork([[1, 2, 3], [1, 2, 3]]) is None
    assert first_fork([[1, 2, 3], [1, 9, 3], [1, 2, 8]]) == 1
    assert first_fork([[1, 2, 3], [1, 2]]) == 2  # a stream that ended early forks at its end
    s = to_dict(summarize_outputs([[1, 2], [1, 3], [1, 2]]))
    assert s == {"runs": 3, "distinct": 2, "first_fork": 1, "counts": [2, 1], "lengths": [2, 2]}


def test_companions_are_longer_so_the_probed_prompt_is_padded():
    ids = [5, 6, 7, 8]
    others = companions(ids, 4)
    assert len(others) == 3
    assert all(len(o) > len(ids) and o[:4] == ids for o in others)


def test_parse_grid_and_points():
    grid = parse_grid(["batch_size=1,2", "dtype=float32,bfloat16", "b.enforce_eager=true,false"])
    assert grid["b.enforce_eager"] == [True, False] and grid["batch_size"] == [1, 2]
    points = grid_points(grid)
    assert len(points) == 8
    # the runtime key varies fastest, so consecutive points share loaded engines
    assert [p["batch_size"] for p in points[:2]] == [1, 2]
    assert points[0]["dtype"] == points[1]["dtype"]
    for bad in (["dtype"], ["dtype="], ["dtype=a", "dtype=b"], [f"seed={','.join(map(str, range(MAX_POINTS + 1)))}"], []):
        with pytest.raises(ConfigError):
            parse_grid(bad)


def _run(fd: int | None, status: str = "diverged") -> Run:
    comp = Comparison(a="ref", b="b", identical=fd is None, first_divergence=fd, compared=10, lengths=[10, 10],
                      explanation=explanation_from_json({"verdict": "numerical near-tie" if fd is not None
                                                         else "identical"}),
                      cross_scores=cross_scores_from_json({"b_by_ref": {"rms_gap": 0.5 if fd is not None else 0.001}}))
    return Run(id=f"r{fd}", created_utc="", model=ModelInfo(name="m", path=""), config={}, status=status,
               sides=[SideInfo(name="ref", kind="hf", reference=True), SideInfo(name="b", kind="vllm")],
               prompts=[PromptResult(index=0, prompt_text="p", prompt_token_ids=[1], comparisons=[comp])])


def test_summary_says_which_key_moves_the_divergence():
    grid = {"dtype": ["float32", "bfloat16"], "batch_size": [1, 2]}
    sweep = Sweep(group_id="g", grid=grid, points=[
        SweepPoint({"dtype": "float32", "batch_size": 1}, _run(None, "ok")),
        SweepPoint({"dtype": "float32", "batch_size": 2}, _run(None, "ok")),
        SweepPoint({"dtype": "bfloat16", "batch_size": 1}, _run(7)),
        SweepPoint({"dtype": "bfloat16", "batch_size": 2}, _run(7)),
    ])
    s = summarize_sweep(sweep)
    effects = {e["key"]: e for e in s["effects"]}
    assert effects["dtype"]["moves_divergence"] is True
    assert effects["batch_size"]["moves_divergence"] is False
    assert effects["dtype"]["first_divergence_by_value"] == {"float32": [None, None], "bfloat16": [7, 7]}
    assert [p["verdict"] for p in s["points"]][2] == "numerical near-tie"
    assert [p["cross_rms_gap"] for p in s["points"]] == [0.001, 0.001, 0.5, 0.5]


def test_error_points_do_not_count_as_effects():
    grid = {"batch_size": [1, 2]}
    sweep = Sweep(group_id="g", grid=grid, points=[SweepPoint({"batch_size": 1}, _run(3)),
                                                   SweepPoint({"batch_size": 2}, _run(None, "error"))])
    assert summarize_sweep(sweep)["effects"][0]["moves_divergence"] is False


def test_cli_rejects_a_bad_probe_and_a_bad_grid_without_engines(tmp_path, capsys):
    db = str(tmp_path / "runs.db")
    assert main(["--db", db, "sweep", "--prompt", PROMPT, "--grid", "dtype"]) == 2
    assert "key=v1,v2" in capsys.readouterr().err
    assert main(["--db", db, "probe", "--prompt", PROMPT, "--n", "1", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "error" and "n >= 2" in out["error"]
    assert get_run(open_db(db), out["run_id"]).kind == "probe"


# -- real engines ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tiny_llama) -> Path:
    return tiny_llama


@pytest.mark.engines
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


@pytest.mark.engines
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


@pytest.mark.engines
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
