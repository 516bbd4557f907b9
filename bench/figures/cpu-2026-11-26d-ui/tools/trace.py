"""One app, one page: open the stored workload N times and a row each time; print the page's timeline:
the click, each fetch (join POSTs) and each SSE chunk's arrival, long tasks, and when ready."""
import sys, os, time, json
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from pathlib import Path
from conftest_browser import running_app, chromium, ARTIFACTS
sys.path.insert(0, "bench")
from ui_render import WL_READY, WL_CLOCK

INIT = r"""
(() => {
  const T = window._T = [];
  const t = () => performance.now();
  const of = window.fetch;
  window.fetch = async function(input, init) {
    const url = typeof input === 'string' ? input : input.url;
    const short = url.replace(/^https?:\/\/[^/]+/, '').slice(0, 60);
    let body = init && init.body; let fn = '';
    try { const j = JSON.parse(body); fn = 'fn=' + j.fn_index + ' trigger=' + j.trigger_id; } catch (e) {}
    T.push([t(), 'fetch>', short, fn]);
    const r = await of.apply(this, arguments);
    T.push([t(), 'fetch<', short, r.status]);
    if (url.includes('queue/data') && r.body) {
      const [a, b] = r.body.tee();
      (async () => { const rd = b.getReader(); const dec = new TextDecoder();
        for (;;) { const {done, value} = await rd.read(); if (done) break;
          const s = dec.decode(value);
          for (const m of s.split('\n\n')) { if (!m.trim()) continue;
            let msg = m.slice(0, 90); try { const j = JSON.parse(m.replace(/^data: /, '')); msg = j.msg + ' ev=' + (j.event_id||'').slice(0,6) + (j.output ? ' bytes=' + JSON.stringify(j.output).length : ''); } catch (e) {}
            T.push([t(), 'sse', msg, value.length]); } } })();
      return new Response(a, {status: r.status, statusText: r.statusText, headers: r.headers});
    }
    return r;
  };
  new PerformanceObserver((l) => l.getEntries().forEach((e) => T.push([e.startTime, 'longtask', Math.round(e.duration)])))
    .observe({entryTypes: ['longtask']});
  document.addEventListener('click', (e) => T.push([e.timeStamp, 'click', (e.target.id || e.target.tagName)]), {capture: true});
})();
"""

def dump(page, label, t0=None):
    T = page.evaluate("window._T.splice(0)")
    T.sort(key=lambda x: x[0])
    clicks = [x for x in T if x[1] == 'click']
    base = t0 if t0 is not None else (clicks[0][0] if clicks else T[0][0])
    print(f"--- {label}")
    for x in T:
        print(f"  {x[0]-base:8.1f} ms  {' '.join(str(v) for v in x[1:])}")

def main():
    db = Path("/tmp/ui6/runs.db"); rid = Path("/tmp/ui6/wid").read_text().strip()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    script = Path(os.environ.get("APP", "/tmp/ui6/app_timed.py"))
    with running_app(db, Path("/tmp/ui6/app.log"), script=script) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.add_init_script(INIT)
        for k in range(n):
            page.goto(url)
            page.get_by_role("tab", name="History").click()
            page.wait_for_function("id => (document.querySelector('#hist-table') || {}).innerText?.includes(id)", arg=rid, timeout=60000)
            page.fill("#hist-run-id textarea, #hist-run-id input", rid)
            page.wait_for_timeout(1500)
            page.evaluate("window._T.splice(0)")
            page.evaluate(WL_CLOCK)
            w0 = time.perf_counter()
            page.click("#hist-open")
            page.wait_for_function(WL_READY, timeout=120000, polling="raf")
            wall = time.perf_counter() - w0
            page.wait_for_timeout(1500)
            c = page.evaluate("window._wlclock")
            page.evaluate("(r) => window._T.push([r, 'READY'])", c["ready"])
            dump(page, f"open {k}: wall {wall:.2f} s page {(c['ready']-c['click'])/1000:.2f} s")
            page.evaluate("""() => { const c = window._pclock = {ready: null};
              const mo = new MutationObserver(() => { if (c.ready === null && document.querySelector('#hist-panes .pt-root[data-init]')) {
                c.ready = performance.now(); window._T.push([c.ready, 'PANES']); mo.disconnect(); } });
              mo.observe(document.documentElement, {childList: true, subtree: true, attributes: true}); }""")
            w0 = time.perf_counter()
            page.evaluate("window._T.push([performance.now(), 'pw-click-start'])")
            page.locator("#hist-wl-prompts tbody tr").nth(50).click()
            page.wait_for_selector("#hist-panes .pt-root[data-init]", timeout=120000)
            wall = time.perf_counter() - w0
            page.wait_for_timeout(1500)
            dump(page, f"row {k}: wall {wall:.2f} s")
    print(open("/tmp/ui6/app.log").read()[-6000:])

main()
