"""A run's trend in real headless Chromium (the app on a database where a recorded-only trend of a
prime-rl run was stored, no engine): the trend opens by its link with its charts, the jump named and
its steps; a click on step 3's point opens that step's replay, whose worst token opens the row's
token view with the two recorded streams (the trainer's logprobs against the rollout's)."""
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
FAKE_APP = Path(__file__).resolve().parents[1] / "fake_app.py"


def test_a_trend_opens_by_its_link_and_a_step_opens_its_replay(tmp_path, new_page):
    from fake_engine import fake_model
    from parity_ui.core.config import build_config
    from parity_ui.service import ParityService, TrendRequest
    from rl_dumps import synthetic_rows, write_prime_step

    ARTIFACTS.mkdir(exist_ok=True)
    model = str(fake_model(tmp_path / "fake"))
    for step in range(1, 6):
        write_prime_step(tmp_path / "run", step, synthetic_rows(step))
    db = tmp_path / "runs.db"
    svc = ParityService(db_path=str(db))
    try:
        trend = svc.trend(TrendRequest(root=str(tmp_path / "run"), model=model, config=build_config(None, [])))
        report = svc.store.trend(trend.id)
    finally:
        svc.close()
    step3 = report.step(3).run_id
    with running_app(db, ARTIFACTS / "browser-trend.log", script=FAKE_APP) as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url + f"?run={trend.id}")
        view = page.wait_for_selector(f"#hist-summary .tr-view[data-run='{trend.id}']", timeout=PAGE_MS)
        text = view.inner_text()
        assert "jumps at step 3" in text and "recorded only: no engine loaded" in text, text
        assert page.locator("#hist-summary svg.tr-chart").count() >= 3
        assert page.locator("#hist-summary table.tr-steps tbody tr").count() == 5
        page.locator("#hist-summary").screenshot(path=str(ARTIFACTS / "trend-view.png"))
        page.locator(f"#hist-summary svg.tr-chart[data-figure='k3'] a[data-run='{step3}']").click()
        page.wait_for_url(f"**?run={step3}", timeout=PAGE_MS)
        page.wait_for_selector(f"#hist-wl-card .pc-workload[data-run='{step3}']", timeout=PAGE_MS)
        worst = "#hist-wl-replay table.rp-worst-table[data-init]"
        page.wait_for_selector(worst, timeout=PAGE_MS)
        assert "recorded vs trainer (recorded)" in page.locator("#hist-wl-replay").inner_text()
        page.locator(f"{worst} tbody tr").first.click()
        page.wait_for_selector("#hist-panes .pt-root[data-init]", timeout=PAGE_MS)
        assert page.locator("#hist-panes .pt-root[data-sel='recorded']").count() == 1
        assert page.locator("#hist-panes .pt-pane").count() == 2  # the recorded trainer and the recorded rollout
