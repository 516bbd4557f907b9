"""Write the README's screenshot (docs/assets/compare-run.png) and its caption from what the app shows.

    .venv/bin/python scripts/readme_screenshot.py     # the real engines: under the engine lock on a shared machine

Starts the real app (app.py) on a fresh database with the bundled demo model preselected, presses
**Run every side** in Debian's headless Chromium (tests/conftest_browser.py), and once the run is shown
takes the shot of its card, its token panes and the details at the fork. The caption is built from
the run the page shows (read back from the app's database by the id on its card: `caption_for`) and
written between the caption markers of README.md and docs/index.md. Nothing is typed by hand, so the
caption cannot drift from the picture (issue 46 item 16: it said token 27 where a fresh clone forks at
21 on this CPU). tests/engines/test_engines.py checks the caption against a run of the app's defaults
on the machine the tests run on.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHOT = ROOT / "docs" / "assets" / "compare-run.png"
PAGES = (ROOT / "README.md", ROOT / "docs" / "index.md")
BEGIN = "<!-- caption: written by scripts/readme_screenshot.py from the run the screenshot shows -->"
END = "<!-- /caption -->"
CAPTION = re.compile(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), re.S)
RUN_MS = 600_000  # the demo's two sides load and generate on the CPU


def _device(run: Any) -> str:
    device = (run.device or "").lower()
    return "CPU" if device.startswith("cpu") else (run.device or "an unknown device")


def caption_for(run: Any) -> str:
    """The caption of a stored run of the app's defaults on the demo model: where the streams part,
    the two tokens and the verdict at the fork, as the run's card says them."""
    dtypes = "/".join(dict.fromkeys(s.dtype for s in run.sides if s.dtype)) or str(run.config.get("dtype"))
    where = f"{_device(run)}, {dtypes}, the default sides HF and vLLM"
    head = f"*The app after **Run every side** on the bundled demo model ({where}): "
    c = run.prompts[0].comparisons[0]
    if c.identical:
        return head + f"the streams are identical for all {c.compared} tokens.*"
    d, e = c.divergence, c.explanation
    parts = f"the streams part at token {c.first_divergence}"
    if d is not None and d.reason != "length":
        parts += f" ({d.texts[0]!r} against {d.texts[1]!r})"
    verdict = ""
    if e is not None and e.verdict:
        verdict = f", a {e.verdict}"
        tie = re.search(r"an exact tie on (.+?) \(", e.summary or "")
        if tie:  # as the card's verdict says it: one side's two tokens had the same logprob
            verdict += f": an exact tie on {tie.group(1)} (both tokens the same logprob there)"
        elif e.verdict == "numerical near-tie" and e.largest_margin is not None:
            verdict += f": each side preferred its token by at most {e.largest_margin:.3g} nats"
        elif e.largest_margin is not None:
            verdict += f": margin {e.largest_margin:.3g} nats"
    return head + parts + verdict + ".*"


def captions_in(text: str) -> list[str]:
    """The captions between the markers of a page's text."""
    return CAPTION.findall(text)


def write_caption(caption: str) -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        if not captions_in(text):
            raise SystemExit(f"{page}: no caption markers ({BEGIN} ... {END})")
        page.write_text(CAPTION.sub(lambda m: f"{BEGIN}\n{caption}\n{END}", text), encoding="utf-8")


def main() -> int:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    from conftest_browser import chromium, running_app

    from parity_ui.store.runs import get_run, open_db

    folder = Path(tempfile.mkdtemp(prefix="parity-readme-"))
    db = folder / "runs.db"
    with running_app(db, folder / "app.log") as url, chromium() as browser:
        # Tall enough for the whole shot in view: off-screen blocks of the panes are not painted
        # (content-visibility), so a shot of them must be on screen.
        page = browser.new_context(viewport={"width": 1260, "height": 2400}).new_page()
        page.set_default_timeout(RUN_MS)
        page.goto(url)
        page.wait_for_selector("#model-info .pc-model")  # the demo, preselected
        page.click("#run-btn")
        page.mouse.move(0, 0)  # off the panes: the details show the fork, not a token under the pointer
        card = page.wait_for_selector("#cmp-summary .pc-summary[data-run]")
        run = get_run(open_db(db), card.get_attribute("data-run"))
        shown = card.inner_text()
        if not _card_matches(run, shown):
            raise SystemExit(f"the page and the stored run disagree: {shown[:200]!r}")
        page.wait_for_selector("#cmp-panes .pt-root[data-init]")
        page.evaluate("window.scrollTo(0, 0)")  # the boxes below in the page's own coordinates
        page.wait_for_timeout(500)
        top = page.locator("#cmp-summary").bounding_box()
        panes = page.locator("#cmp-panes").bounding_box()
        page.screenshot(
            path=str(SHOT),
            clip={
                "x": min(top["x"], panes["x"]),
                "y": top["y"],
                "width": max(top["width"], panes["width"]),
                "height": panes["y"] + panes["height"] - top["y"],
            },
        )
    caption = caption_for(run)
    write_caption(caption)
    print(f"wrote {SHOT.relative_to(ROOT)} and the caption:\n{caption}")
    return 0


def _card_matches(run: Any, shown: str) -> bool:
    """The card says what the stored run says (the screenshot and the caption are of one run)."""
    c = run.prompts[0].comparisons[0]
    return ("IDENTICAL" in shown) if c.identical else (f"DIVERGED at token {c.first_divergence}" in shown)


if __name__ == "__main__":
    sys.exit(main())
