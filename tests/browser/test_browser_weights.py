"""The Weights tab in real headless Chromium (issue 41): a stored weight check (written with the store's
functions, no engine: tests/engines/test_weights_engines.py makes real ones) picked from the tab's
list shows its verdict and its tensors table with the differing tensor first, named by its checkpoint
source inside the fused tensor."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium_available, running_app  # noqa: E402

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

PAGE_MS = 180_000


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    from parity_ui.core.weights import (DIFFERS, EQUAL, ProbeComparison, ProbeRecord, TensorFigure, UpdateRecord,
                                        WeightReport)
    from parity_ui.store import Store

    db = tmp_path_factory.mktemp("db") / "runs.db"
    unit = "dp0:pp0:pcp0:tp0|"
    # in the model's order, the differing one in the middle: the view must put it first
    tensors = [
        TensorFigure(unit + "model.embed_tokens.weight", "dp0:pp0:pcp0:tp0", "model.embed_tokens.weight", None,
                     ["model.embed_tokens.weight"], [1024, 128], "float32", EQUAL, "aa11", "aa11"),
        TensorFigure(unit + "model.layers.1.mlp.gate_up_proj.weight[up_proj]", "dp0:pp0:pcp0:tp0",
                     "model.layers.1.mlp.gate_up_proj.weight", "up_proj", ["model.layers.1.mlp.up_proj.weight"],
                     [256, 128], "float32", DIFFERS, "bb22", "cc33", max_abs=0.41, rel_l2=0.5, n_differ=32768,
                     numel=32768),
        TensorFigure(unit + "model.norm.weight", "dp0:pp0:pcp0:tp0", "model.norm.weight", None, ["model.norm.weight"],
                     [128], "float32", EQUAL, "dd44", "dd44"),
    ]
    probe = ProbeRecord(8, 256, [ProbeComparison("updated", "fresh", "the fresh load scored twice", 256, 0.31, 0.02,
                                                 0.0, 0.0, "exceeds noise", "exceeds", first_token=3)])
    report = WeightReport(model="/ckpt/step-200", start_from="/ckpt/step-100", updated="updated (vllm-updated)",
                          fresh="fresh (vllm)", reference="ref (hf)", run_id="01WEIGHTSBROWSER", tensors=tensors,
                          probe=probe, update=UpdateRecord("/ckpt/step-100", "/ckpt/step-200", "reload", pushed=20,
                                                           skipped=["model.layers.1.mlp.up_proj.weight"]))
    Store.open(db).save_weight_check(report.run_id, "2026-11-28T06:00:00", report.to_dict())
    return {"db": db, "run_id": report.run_id}


def test_the_weights_tab_shows_a_stored_check_with_the_differing_tensor_first(stored, new_page):
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(stored["db"], ARTIFACTS / "browser-weights.log") as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url)
        page.get_by_role("tab", name="Weights").click()
        page.click("#wt-stored input")
        page.get_by_role("option", name=stored["run_id"], exact=False).click()
        view = page.wait_for_selector("#wt-view .weights-check", timeout=PAGE_MS)
        assert view.get_attribute("data-verdict") == "NOT LANDED"
        rows = page.locator("#wt-view table.weights-table tbody tr")
        assert rows.count() == 3
        assert rows.nth(0).get_attribute("data-status") == "differs"
        first = rows.nth(0).inner_text()
        assert "model.layers.1.mlp.up_proj.weight" in first and "up_proj" in first and "32768/32768 differ" in first
        assert [rows.nth(i).get_attribute("data-status") for i in (1, 2)] == ["equal", "equal"]
        assert "left out: model.layers.1.mlp.up_proj.weight" in view.inner_text()
        page.locator("#wt-view").screenshot(path=str(ARTIFACTS / "17-weights.png"))
