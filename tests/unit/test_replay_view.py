"""The app's side of a replay, above the engines (the fake kind in real worker processes): a rollout
dump uploaded on the Compare tab is told apart from a workload file, described, size-limited (a
larger one is pointed to the CLI) and run as a replay; its view (the pairs table, the worst tokens
first, each opening its row's token view at that token with the recorded side), History's row, and
a dump its preflight refuses shown, not stored."""
from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("gradio")

import gradio as gr  # noqa: E402

from fake_engine import registered  # noqa: E402
from parity_ui.core.config import build_config  # noqa: E402
from parity_ui.store import runs as store  # noqa: E402
from parity_ui.ui.runner import AppService  # noqa: E402
from parity_ui.ui.workload_input import WorkloadPick  # noqa: E402

N = 12
SIDES = ["ref=fake", "b=fake,shift=0.05"]


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=256))


@pytest.fixture(scope="module")
def runner(model, tmp_path_factory):
    r = AppService(str(tmp_path_factory.mktemp("db") / "runs.db"))
    yield r
    r.close()


def _dump(path, n=N, bad_token=None):
    rnd = random.Random(1)
    with open(path, "w") as f:
        for i in range(n):
            resp = [rnd.randrange(8, 400) for _ in range(5)]
            if bad_token is not None and i == 3:
                resp[2] = bad_token
            # The fake trainer gives an unlisted token -12: row 4's token 1 is recorded 30 nats off.
            lps = [-12.0 - (30.0 if (i, t) == (4, 1) else 0.0) for t in range(5)]
            f.write(json.dumps({"prompt_ids": [1, 8 + i, 9], "response_ids": resp, "rollout_logprobs": lps}) + "\n")
    return str(path)


def _compare(runner):
    from parity_ui.ui.compare_tab import CompareTab, RunGate

    tab = CompareTab(runner, RunGate(runner))
    with gr.Blocks():
        tab.create_ui()
    return tab


def test_an_uploaded_dump_runs_as_a_replay_and_its_worst_token_opens_with_the_recorded_side(runner, model, tmp_path):
    from parity_ui.ui.history_tab import ID, RESULT, history_rows

    tab = _compare(runner)
    pick = tab.upload(_dump(tmp_path / "rollouts.jsonl"), WorkloadPick())[tab.workload]
    assert pick.rollout == "parity" and pick.prompts == N and pick.is_workload and pick.error is None
    note = tab.upload(_dump(tmp_path / "rollouts.jsonl"), WorkloadPick())[tab.prompt_info]
    assert "a rollout dump (parity-ui rollout format), 12 rows" in note and "Runs as a replay of 12 rows" in note
    cfg = build_config(None, [], sides=SIDES)
    updates = list(tab.run(model, False, "", None, cfg.to_yaml(), None, pick))
    run = store.get_run(runner.db, updates[-1][tab.run_id], prompts=[])
    assert run.kind == "replay" and run.workload.done == N, (run.status, run.error)
    shown = tab.wview.revealed(run.id)
    view = shown[tab.wview.replay]
    assert "recorded vs ref" in view and "ρ outside [0.8, 1.2]" in view
    pairs = view[view.index("rp-pairs-table"):]
    row = pairs[pairs.index("<tr data-pair"):]
    row = row[:row.index("</tr>")]
    assert row.count("%</td>") == 4, row  # the three ρ bands and |Δlogprob| > ln 2: percentages, not "1"
    assert "REPLAYED, NO FLOOR" in shown[tab.wview.card] and "IDENTICAL" not in shown[tab.wview.card]
    assert shown[tab.wview.survival_plot].visible is False  # forced tokens never fork
    assert "rows of rollouts.jsonl (parity)" in view and "rollouts.jsonl: 12 rows" in shown[tab.wview.card]
    table = shown[tab.wview.table]  # the prompt table: each pair headed "b vs a", only its largest gap (no forks)
    assert "recorded vs ref max |Δlp|" in table and " fork</th>" not in table and " verdict</th>" not in table
    worst = view[view.index("rp-worst-table"):]
    assert worst.index('<tr data-i="4" data-at="1">') == worst.index("<tr ")  # the perturbed token: first
    assert f'data-pick="{tab.wview.prefix}"' in worst and "+30" in worst  # Δ = trainer − rollout = +30
    got = tab.wview.open_prompt(run.id, "4@1")
    # the row by its one name (its place in the dump, as the tables name it), its index beside it
    assert f"line 5 of replay {run.id} (prompt 4)" in got[tab.view.summary] and "Token 1" in got[tab.view.summary]
    assert "REPLAYED" in got[tab.view.summary] and "IDENTICAL" not in got[tab.view.summary]  # forced tokens: no fork
    assert "forced tokens (the run's own, on every side); max |logprob gap|" in got[tab.view.summary]
    assert 'data-sel="recorded"' in got[tab.view.panes]  # the trainer against the recorded rollout
    assert 'data-focus="1"' in got[tab.view.panes]  # opened at the worst token, marked there
    figs = tab.wview.prompt_figures(run.id, "4@1")  # the figures that follow: of the same pair, not the first side's
    assert "recorded vs ref" in str(figs[tab.view.logprob_plot].value)
    assert tab.wview.open_prompt(run.id, "nonsense") == gr.skip()
    (row,) = [r for r in history_rows(runner.store) if r[ID] == run.id]
    assert row[RESULT].startswith("replay of 12/12 rows")
    # The static report shows the replay: its pairs and worst tokens (no click to open there).
    from parity_ui.render.report import stored_html_report, workload_report_prompts

    page = stored_html_report(runner.store.for_report(run.id, workload_report_prompts))
    assert "rp-pairs-table" in page and '<tr data-i="4" data-at="1">' in page
    assert 'rp-worst-table" data-pick' not in page


def test_a_dump_over_the_upload_limit_points_to_the_cli(runner, tmp_path, monkeypatch):
    import parity_ui.inputs.prompts as prompts

    monkeypatch.setattr(prompts, "MAX_PROMPT_FILE_BYTES", 100)
    tab = _compare(runner)
    pick = tab.upload(_dump(tmp_path / "big.jsonl"), WorkloadPick())[tab.workload]
    assert pick.rollout == "parity" and "over the app's" in pick.error
    assert "parity replay FILE --model MODEL" in pick.fix


def test_a_dump_its_preflight_refuses_is_shown_not_stored(runner, model, tmp_path):
    tab = _compare(runner)
    pick = tab.upload(_dump(tmp_path / "other.jsonl", bad_token=100_000), WorkloadPick())[tab.workload]
    before = len(store.list_runs(runner.db))
    cfg = build_config(None, [], sides=SIDES)
    last = list(tab.run(model, False, "", None, cfg.to_yaml(), None, pick))[-1]
    assert last[tab.run_id] is None and "vocabulary" in last[tab.view.summary] and "Not run" in last[tab.view.summary]
    assert len(store.list_runs(runner.db)) == before
