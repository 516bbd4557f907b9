"""How the app feels, measured in headless Chromium against the real app. Prints figures; not a test.

1. Click Run -> first token chip shown in the live pane (cold: engines load; warm: reused), on
   a tiny real model with both real engines.
2. A stored run of 16k tokens per engine (built synthetically into the app's runs.db): time for
   the server to build the view, from clicking "Open run" to the panes being on screen and
   interactive (the details JSON is parsed then), a hover, and frame times while scrolling a pane.
3. A stored workload of 1,000 prompts x 128 tokens (written with the store's functions): from
   clicking "Open run" in History to the workload view shown and interactive (its card, both
   charts drawn, the prompt table's script ready), a sort of the 1,000-row table in the page (its
   script, and until drawn), and its 51st row clicked -> that prompt's token view. Goal: under 1 s
   from the click to the view.

    .venv/bin/python bench/ui_render.py [--tokens 16384] [--skip-engines] [--workload 1000 --workload-tokens 128]
                                        [--only-workload]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from conftest_browser import ARTIFACTS, chromium, running_app  # noqa: E402


def synthetic_run(n: int, created: str = "2026-01-01T00:00:00.000+00:00"):
    from parity_ui.analysis.compare import compare
    from parity_ui.store.runs import new_run_id
    from parity_ui.core.types import ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob

    rng = random.Random(0)
    words = [" the", " cat", " sat", " on", "\n", " mat", ",", " and", "\t", " a", " dog", "."] + [
        f" w{i}" for i in range(400)
    ]

    def stream(name: str, fork: int) -> SideResult:
        steps = []
        for i in range(n):
            tid = (i * 7919) % len(words) if i < fork or name == "vllm" else (i * 31) % len(words)
            lp = -rng.random() * 3
            top = [TopLogprob(tid, lp, words[tid])] + [
                TopLogprob(t, lp - 0.2 * (k + 1), words[t]) for k, t in enumerate(rng.sample(range(len(words)), 4))
            ]
            steps.append(TokenStep(position=i, token_id=tid, text=words[tid], logprob=lp, rank=1, top=top))
        return SideResult(
            side=name, prompt_index=0, token_ids=[s.token_id for s in steps], steps=steps, finish_reason="length"
        )

    fork = int(n * 0.75)
    v, h = stream("vllm", fork), stream("hf", fork)
    p = PromptResult(
        index=0,
        prompt_text="synthetic",
        prompt_token_ids=[1],
        results={"hf": h, "vllm": v},
        comparisons=[compare(h, v)],
    )
    return Run(
        id=new_run_id(),
        created_utc=created,
        model=ModelInfo(name="synthetic-16k", path="/nowhere"),
        config={"dtype": "bfloat16"},
        status="diverged",
        prompts=[p],
        sides=[SideInfo(name="hf", kind="hf", reference=True), SideInfo(name="vllm", kind="vllm")],
    )


def synthetic_workload(db, n: int, tokens: int, created: str = "2026-01-02T00:00:00.000+00:00"):
    """A stored workload run of `n` prompts x `tokens` generated tokens, sides ref, b and the floor,
    written straight into `db` with the store's functions (what run_workload stores, without
    engines): b forks at a different token on most prompts (a third identical), the floor on a few,
    every logprob a little apart; the report pooled from the stored samples. Returns the Run."""
    from parity_ui.analysis.compare import compare
    from parity_ui.store.runs import new_run_id, save_pair_samples, save_run, save_run_row
    from parity_ui.core.types import ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob
    from parity_ui.commands.workload.report import pooled
    from parity_ui.store import Store
    from parity_ui.core.workload_record import FloorSpec, WorkloadOptions, WorkloadReport
    from parity_ui.measures.tokens import free_sample

    rng = random.Random(1)
    words = [" the", " cat", " sat", " on", "\n", " mat", ",", " and", " a", " dog", "."] + [
        f" w{i}" for i in range(200)
    ]

    def stream(name: str, i: int, fork: int | None, gap: float) -> SideResult:
        steps = []
        for k in range(tokens):
            tid = (i * 131 + k * 7919) % len(words) if fork is None or k < fork else (i + k * 31 + 1) % len(words)
            lp = -((i * 17 + k * 13) % 97) / 40 - 0.01 - gap * rng.random()
            top = [TopLogprob(tid, lp, words[tid])] + [
                TopLogprob((tid + r) % len(words), lp - 0.3 * r, words[(tid + r) % len(words)]) for r in (1, 2, 3, 4)
            ]
            steps.append(TokenStep(position=k, token_id=tid, text=words[tid], logprob=lp, rank=1, top=top))
        return SideResult(
            side=name,
            prompt_index=i,
            token_ids=[s.token_id for s in steps],
            steps=steps,
            text="".join(s.text for s in steps),
            finish_reason="length",
        )

    run = Run(
        id=new_run_id(),
        created_utc=created,
        model=ModelInfo(name="synthetic-workload", path="/nowhere"),
        config={"dtype": "bfloat16", "max_new_tokens": tokens},
        status="running",
        kind="workload",
        sides=[
            SideInfo(name="ref", kind="hf", reference=True),
            SideInfo(name="b", kind="vllm"),
            SideInfo(name="floor", kind="hf"),
        ],
    )
    samples: dict[str, list] = {"b": [], "floor": []}
    for i in range(n):
        forks = {
            "b": None if i % 3 == 0 else rng.randrange(1, tokens),
            "floor": rng.randrange(tokens // 2, tokens) if i % 10 == 0 else None,
        }
        ref = stream("ref", i, None, 0.0)
        results = {
            "ref": ref,
            **{name: stream(name, i, fork, 0.02 if name == "b" else 0.004) for name, fork in forks.items()},
        }
        comps = [compare(ref, results[name]) for name in forks]
        for c in comps:
            samples[c.b].append(free_sample(c, ref, results[c.b]))
        text = f"def f{i}(x):\n    return x * {i}  # prompt {i} of the synthetic workload"
        run.prompts.append(
            PromptResult(
                index=i,
                prompt_text=text,
                prompt_token_ids=[1, 2, 3],
                results=results,
                comparisons=comps,
                given={"text": text, "messages": None},
            )
        )
    report = WorkloadReport(
        options=WorkloadOptions(source={"description": f"all {n:,} prompts (synthetic)"}),
        floor=FloorSpec("batch", "floor", "the reference ref again at batch 8, its prompts in reverse order"),
        n_prompts=n,
        done=n,
    )
    save_run(db, run)
    for name, got in samples.items():
        save_pair_samples(db, run.id, name, got)
    run.workload = pooled(Store(db), run.id, report, ["b"])
    run.status = "ok" if run.identical else "diverged"
    save_run_row(db, run)
    return run


ROW = 50  # the row of the sorted prompt table clicked (0-based), or the middle one of fewer

# The page's own clock: the click event's time, the moment the panes' script initialised them, and
# the main thread's long tasks (the browser cannot answer a hover during one).
PAGE_CLOCK = """() => {
  const c = window._clock = {click: null, init: null, long: []};
  document.addEventListener('click', (e) => { if (c.click === null) c.click = e.timeStamp; }, {capture: true});
  new PerformanceObserver((l) => l.getEntries().forEach((e) => c.long.push([e.startTime, e.duration])))
    .observe({entryTypes: ['longtask']});
  const mo = new MutationObserver(() => {
    if (c.init === null && document.querySelector('#hist-panes .pt-root[data-init]')) { c.init = performance.now(); mo.disconnect(); }
  });
  mo.observe(document.documentElement, {childList: true, subtree: true, attributes: true});
}"""


# The workload view is shown and interactive when its card, its prompt table (with the page's
# script attached: sortable, rows clickable) and both charts (plotly drawn) are on the page.
WL_READY = """() => !!(document.querySelector('#hist-wl-card .pc-workload')
    && document.querySelector('#hist-wl-prompts table.wl-table[data-init]')
    && document.querySelector('#hist-wl-survival .js-plotly-plot .main-svg, #hist-wl-survival svg.wl-svg')
    && document.querySelector('#hist-wl-hist .js-plotly-plot .main-svg, #hist-wl-hist svg.wl-svg'))"""
WL_CLOCK = (
    """() => {
  const c = window._wlclock = {click: null, ready: null};
  document.addEventListener('click', (e) => { if (c.click === null) c.click = e.timeStamp; }, {capture: true});
  const ready = %s;
  const mo = new MutationObserver(() => { if (c.ready === null && ready()) { c.ready = performance.now(); mo.disconnect(); } });
  mo.observe(document.documentElement, {childList: true, subtree: true, attributes: true});
}"""
    % WL_READY
)


def bench_workload(page, url: str, run_id: str, n: int) -> dict[str, float]:
    """Open the stored workload `run_id` from the History tab (typed id, "Open run"); then sort its
    table and open a prompt from it."""
    page.goto(url)
    page.get_by_role("tab", name="History").click()
    page.wait_for_function(
        "id => (document.querySelector('#hist-table') || {}).innerText?.includes(id)", arg=run_id, timeout=60_000
    )
    page.fill("#hist-run-id textarea, #hist-run-id input", run_id)
    page.evaluate(WL_CLOCK)
    t0 = time.perf_counter()
    page.click("#hist-open")
    page.wait_for_function(WL_READY, timeout=120_000, polling="raf")
    shown = time.perf_counter() - t0
    clock = page.evaluate("window._wlclock")
    # Every row is in the table: laid out, or waiting in its <template> (moved in as the table is scrolled).
    rows = page.evaluate(
        "document.querySelectorAll('#hist-wl-prompts tbody tr').length + "
        "((document.querySelector('#hist-wl-prompts template.wl-rest') || {}).content"
        " || {childElementCount: 0}).childElementCount"
    )
    assert rows == n, rows
    # A sort's script, then the same click until the page has drawn it (two frames: the sorted rows'
    # style, layout and paint, which the script's time leaves out), one way and back.
    sort_ms = page.evaluate("""async () => {
        const th = document.querySelector('#hist-wl-prompts th[data-col="fork:b"]');
        const drawn = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        const out = [];
        for (let k = 0; k < 2; k++) {
          const t0 = performance.now(); th.click(); const t1 = performance.now(); await drawn();
          out.push(t1 - t0, performance.now() - t0);
        }
        return out;
    }""")
    # The page's own clock too: from the row's click event to its panes initialised (Playwright's wall
    # clock adds its own actionability checks and polling, ~0.5-1.5 s on 2 busy cores).
    page.evaluate("""() => {
      const c = window._pclock = {click: null, ready: null};
      document.addEventListener('click', (e) => { if (c.click === null) c.click = e.timeStamp; }, {capture: true});
      const mo = new MutationObserver(() => { if (c.ready === null && document.querySelector('#hist-panes .pt-root[data-init]')) {
        c.ready = performance.now(); mo.disconnect(); } });
      mo.observe(document.documentElement, {childList: true, subtree: true, attributes: true});
    }""")
    t1 = time.perf_counter()
    # The 51st row of the sorted table (a user scrolls a little and clicks; the app lays out the rows
    # below its first 100 as the table is scrolled near them).
    page.locator("#hist-wl-prompts tbody tr").nth(min(n // 2, ROW)).click()
    page.wait_for_selector("#hist-panes .pt-root[data-init]", timeout=120_000)
    prompt_s = time.perf_counter() - t1
    pclock = page.evaluate("window._pclock")
    html_kib = page.evaluate("document.querySelector('#hist-wl-prompts').innerHTML.length") / 2**10
    return {
        "open_s": shown,
        "page_clock_s": (clock["ready"] - clock["click"]) / 1000,
        "sort_ms": sort_ms[0],
        "sort_drawn_ms": sort_ms[1],
        "sort_back_ms": sort_ms[2],
        "sort_back_drawn_ms": sort_ms[3],
        "prompt_s": prompt_s,
        "table_kib": html_kib,
        "prompt_clock_s": (pclock["ready"] - pclock["click"]) / 1000,
    }


def bench_first_token(page, url: str, model: str) -> list[float]:
    page.goto(url)
    page.wait_for_selector("#model-info .pc-model", timeout=60_000)
    box = page.locator("#model-pick input")
    box.click()
    box.fill(model)
    box.press("Enter")
    page.wait_for_selector(f"#model-info:has-text('{model}')", timeout=30_000)
    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        page.click("#run-btn")
        page.wait_for_selector("#cmp-panes .pt-root[data-live] .pt-body .t", timeout=300_000)
        out.append(time.perf_counter() - t0)
        page.wait_for_selector("#cmp-summary .pc-summary", timeout=300_000)
    return out


def bench_stored(page, url: str, run_id: str, n: int, read_list_s: float = 0.0) -> dict[str, float]:
    """Open `run_id` from the History tab; `read_list_s`: the pause of a user reading the list
    (shown) before clicking, in which the app reads the newest listed run ahead."""
    page.goto(url)
    page.get_by_role("tab", name="History").click()
    if read_list_s:
        page.wait_for_function(
            "id => (document.querySelector('#hist-table') || {}).innerText?.includes(id)", arg=run_id, timeout=60_000
        )
        page.wait_for_timeout(read_list_s * 1000)
    page.fill("#hist-run-id textarea, #hist-run-id input", run_id)
    page.evaluate(PAGE_CLOCK)
    t0 = time.perf_counter()
    page.click("#hist-open")
    page.wait_for_selector("#hist-panes .pt-root[data-init]", timeout=120_000)
    shown = time.perf_counter() - t0

    page.wait_for_selector("#hist-panes .pt-root[data-full='1'], #hist-panes .pt-root:not([data-src])", timeout=120_000)
    full = time.perf_counter() - t0
    page.wait_for_timeout(max(0.0, 2.0 - (time.perf_counter() - t0 - shown)) * 1000)
    clock = page.evaluate("window._clock")
    in_page = clock["init"] - clock["click"]
    busy = sum(d for start, d in clock["long"] if clock["init"] <= start < clock["init"] + 2000)
    print(
        f"  page clock: click event -> panes initialised {in_page / 1000:.2f} s; then the page was busy "
        f"{busy:.0f} ms in long tasks over the next 2 s (figures drawn, details fetched)"
    )
    inline = page.evaluate("document.querySelector('#hist-panes .pt-json').textContent.length")
    print(
        f"  details inline at open: {inline / 2**10:.0f} KiB; every position's details in the page after {full:.2f} s"
    )
    count = page.evaluate("document.querySelectorAll('#hist-panes .pt-body .t').length")
    blocks = page.evaluate("document.querySelectorAll('#hist-panes .pt-body .b').length")
    print(f"  DOM at open: {count} token chips built of {2 * n} ({blocks} blocks; the rest build as they scroll near)")
    hover = page.evaluate("""() => {
        const chips = document.querySelectorAll('#hist-panes [data-side="hf"] .pt-body .t');
        const t0 = performance.now();
        chips[chips.length - 5].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
        const t1 = performance.now();
        chips[10].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
        return [t1 - t0, performance.now() - t1];
    }""")
    page.locator("#hist-panes").scroll_into_view_if_needed()
    jump, step = page.evaluate("""async () => {
        const body = document.querySelector('#hist-panes .pt-body');
        const frame = () => new Promise((r) => requestAnimationFrame(r));
        let t0 = performance.now();
        for (let k = 0; k < 20; k++) { body.scrollTop = body.scrollHeight * k / 20; await frame(); }
        const jump = (performance.now() - t0) / 20;
        t0 = performance.now();
        for (let k = 0; k < 60; k++) { body.scrollTop += 60; await frame(); }
        return [jump, (performance.now() - t0) / 60];
    }""")
    page.locator("#hist-panes").scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    page.locator("#hist-panes").screenshot(path=str(ARTIFACTS / "bench-16k-panes.png"))
    built = page.evaluate("document.querySelectorAll('#hist-panes .pt-body .t').length")
    print(f"  after scrolling through: {built} chips built")
    return {
        "open_s": shown,
        "page_clock_s": in_page / 1000,
        "first_hover_ms": hover[0],
        "next_hover_ms": hover[1],
        "jump_ms": jump,
        "step_ms": step,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--skip-engines", action="store_true", help="only the stored-run render")
    ap.add_argument("--workload", type=int, default=1000, help="prompts of the stored workload (0: none)")
    ap.add_argument("--workload-tokens", type=int, default=128, help="tokens per prompt and side of the workload")
    ap.add_argument("--opens", type=int, default=5, help="opens of the workload (the median is reported)")
    ap.add_argument("--only-workload", action="store_true", help="only the workload case")
    args = ap.parse_args()
    ARTIFACTS.mkdir(exist_ok=True)
    from parity_ui.store.runs import open_db, save_run
    from parity_ui.ui.result_view import view_parts

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "runs.db"
        run = synthetic_run(args.tokens)
        older = synthetic_run(args.tokens, created="2025-12-31T00:00:00.000+00:00")  # not the newest: not read ahead
        oldest = synthetic_run(args.tokens, created="2025-12-30T00:00:00.000+00:00")
        for r in (run, older, oldest):
            save_run(open_db(db), r)
        workload = None
        if args.workload:
            t0 = time.perf_counter()
            # Older than the 16k runs: the History list's read ahead takes the newest, not this one.
            workload = synthetic_workload(
                open_db(db), args.workload, args.workload_tokens, created="2025-12-01T00:00:00.000+00:00"
            )
            print(
                f"stored workload: {args.workload} prompts x {args.workload_tokens} tokens, sides ref, b and the floor "
                f"(written in {time.perf_counter() - t0:.1f} s): {workload.workload.headline}"
            )
        if args.only_workload:
            with running_app(db, ARTIFACTS / "bench-app.log") as url, chromium() as browser:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                report_workload(page, url, workload, args)
            return
        t0 = time.perf_counter()
        parts = view_parts(run)
        build_s = time.perf_counter() - t0
        print(f"stored run: {args.tokens} tokens per side, first divergence at {run.first_divergence}")
        print(f"  server: view built in {build_s:.2f} s; panes HTML {len(parts['panes']) / 2**20:.2f} MiB")
        model = None
        if not args.skip_engines:
            from tiny_models import build_model

            model = str(build_model(Path(tmp) / "tiny", "llama", dtype="bfloat16"))
        with running_app(db, ARTIFACTS / "bench-app.log") as url, chromium() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for label, run_id, pause in (
                ("first open in this app process, an older run (not read ahead), clicked at once", older.id, 0.0),
                ("an older run (not read ahead, not opened before), clicked 1 s after the list showed", oldest.id, 1.0),
                ("the newest run, clicked 1 s after the list showed (read ahead meanwhile)", run.id, 1.0),
                ("the newest run opened again (a fresh page), clicked at once", run.id, 0.0),
            ):
                r = bench_stored(page, url, run_id, args.tokens, pause)
                print(f"  browser, {label}: click Open -> panes shown and interactive {r['open_s']:.2f} s")
                print(
                    f"  hover a far token {r['first_hover_ms']:.1f} ms, a near one {r['next_hover_ms']:.1f} ms; "
                    f"frame time scrolling a pane: 60 px steps {r['step_ms']:.1f} ms, 1/20-height jumps {r['jump_ms']:.1f} ms"
                )
            if workload is not None:
                report_workload(page, url, workload, args)
            if model:
                cold, warm = bench_first_token(page, url, model)
                print(
                    f"click Run -> first token shown (tiny Llama, both real engines, CPU): "
                    f"cold {cold:.2f} s (engines load), warm {warm:.2f} s"
                )


def report_workload(page, url: str, workload, args) -> None:
    from statistics import median

    opens = [bench_workload(page, url, workload.id, args.workload) for _ in range(max(args.opens, 1))]
    first, rest = opens[0], opens[1:] or opens
    print(
        f"  browser, workload of {args.workload} prompts: click Open -> view shown and interactive "
        f"{first['open_s']:.2f} s the first time in this app process (page clock {first['page_clock_s']:.2f} s); "
        f"median of {len(rest)} more opens {median(o['open_s'] for o in rest):.2f} s "
        f"(page clock {median(o['page_clock_s'] for o in rest):.2f} s); goal < 1 s"
    )
    print(
        f"  prompt table {first['table_kib']:.0f} KiB of HTML; sorting its {args.workload} rows in the page: "
        f"{median(o['sort_ms'] for o in opens):.0f} ms of script ({median(o['sort_drawn_ms'] for o in opens):.0f} ms "
        f"until drawn), the other way {median(o['sort_back_ms'] for o in opens):.0f} ms "
        f"({median(o['sort_back_drawn_ms'] for o in opens):.0f} ms until drawn); "
        f"row {min(args.workload // 2, ROW) + 1} clicked -> that prompt's token view {median(o['prompt_s'] for o in opens):.2f} s "
        f"(page clock {median(o['prompt_clock_s'] for o in opens):.2f} s)"
    )
    page.locator("#hist-wl").screenshot(path=str(ARTIFACTS / "bench-workload-view.png"))


if __name__ == "__main__":
    main()
