"""A replay in real headless Chromium (the app with the fake engine kinds, tests/fake_app.py, on a
fresh database): a small rollout dump uploaded on the Compare tab is described as a replay, runs,
shows its view (the pairs and the worst tokens first), and a worst token opens its row's token view
with the recorded rollout beside the trainer. Seconds of engine work."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium_available, running_app  # noqa: E402

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

PAGE_MS = 180_000
REPLY_MS = 120_000
FAKE_APP = Path(__file__).resolve().parents[1] / "fake_app.py"
SIDES = "sides: [{name: ref, kind: fake}, {name: b, kind: fake, shift: 0.05}]"


def _dump(path: Path) -> Path:
    rnd = random.Random(1)
    with open(path, "w") as f:
        for i in range(8):
            resp = [rnd.randrange(8, 400) for _ in range(5)]
            lps = [-12.0 - (30.0 if (i, t) == (4, 1) else 0.0) for t in range(5)]  # row 4, token 1: the worst
            f.write(json.dumps({"prompt_ids": [1, 8 + i, 9], "response_ids": resp, "rollout_logprobs": lps}) + "\n")
    return path


def test_an_uploaded_dump_replays_and_its_worst_token_opens_with_the_recorded_rollout(tmp_path, new_page):
    from fake_engine import fake_model

    ARTIFACTS.mkdir(exist_ok=True)
    model = str(fake_model(tmp_path / "fake", max_position_embeddings=256))
    with running_app(tmp_path / "runs.db", ARTIFACTS / "browser-replay.log", script=FAKE_APP) as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url)
        page.wait_for_selector("#model-info .pc-model", timeout=PAGE_MS)
        box = page.locator("#model-pick input")
        box.click()
        box.fill(model)
        box.press("Enter")
        page.wait_for_selector(f"#model-info:has-text('{model}')", timeout=REPLY_MS)
        page.get_by_role("tab", name="Config").click()
        editor = page.locator("#cfg-yaml .cm-content")
        editor.click()
        page.keyboard.press("Control+A")
        page.keyboard.type(SIDES + "\n")
        editor.blur()
        page.get_by_role("tab", name="Compare").click()
        with page.expect_file_chooser() as chooser:
            page.click("#prompt-file")
        chooser.value.set_files(str(_dump(tmp_path / "rollouts.jsonl")))
        note = page.wait_for_selector("#prompt-count .wl-pick", timeout=REPLY_MS)
        assert "a rollout dump" in note.inner_text() and "Runs as a replay of 8 rows" in note.inner_text()
        page.click("#run-btn")
        worst = "#cmp-wl-replay table.rp-worst-table[data-init]"
        page.wait_for_selector(worst, timeout=REPLY_MS)
        view = page.locator("#cmp-wl-replay").inner_text()
        assert "recorded vs ref" in view and "ρ outside [0.8, 1.2]" in view, view
        first = page.locator(f"{worst} tbody tr").first
        assert (first.get_attribute("data-i"), first.get_attribute("data-at")) == ("4", "1")
        page.screenshot(path=str(ARTIFACTS / "replay-view.png"), full_page=False)
        first.click()
        page.wait_for_selector("#cmp-summary:has-text('line 5 of replay')", timeout=REPLY_MS)  # the row by its one name
        assert "Token 1" in page.locator("#cmp-summary").inner_text()
        page.wait_for_selector("#cmp-panes .pt-root[data-init]", timeout=REPLY_MS)
        assert page.locator("#cmp-panes .pt-root[data-sel='recorded']").count() == 1  # trainer vs the rollout
        # The opened token is marked in every pane, in view there, and its details are shown.
        marked = page.locator("#cmp-panes .pt-root[data-focus='1'] .t.f")
        assert marked.count() == page.locator("#cmp-panes .pt-pane").count() >= 2
        for k in range(marked.count()):
            chip, body = marked.nth(k).bounding_box(), marked.nth(k).locator("xpath=ancestor::div[@class='pt-body']")
            box = body.bounding_box()
            assert box["y"] <= chip["y"] and chip["y"] + chip["height"] <= box["y"] + box["height"] + 1
        assert "position 1" in page.locator("#cmp-panes .pt-info").inner_text().lower()
        page.locator("#cmp-panes").screenshot(path=str(ARTIFACTS / "replay-token-panes.png"))
        page.screenshot(path=str(ARTIFACTS / "replay-token.png"), full_page=False)
