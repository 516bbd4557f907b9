"""Chromium's timeline (devtools.timeline + v8 sampling) of one Open click and one row click; prints the
top-level tasks over 20 ms with their biggest children (by category) and the top JS functions."""
import sys, os, time, json, collections
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from pathlib import Path
from conftest_browser import running_app, chromium
sys.path.insert(0, "bench")
from ui_render import WL_READY, WL_CLOCK

def trace(page, cdp, action, wait, label):
    chunks = []
    cdp.on("Tracing.dataCollected", lambda p: chunks.extend(p["value"]))
    done = []
    cdp.on("Tracing.tracingComplete", lambda p: done.append(1))
    cdp.send("Tracing.start", {"categories": "devtools.timeline,disabled-by-default-devtools.timeline,v8.execute,disabled-by-default-v8.cpu_profiler,blink.user_timing",
                               "transferMode": "ReportEvents"})
    page.wait_for_timeout(300)
    page.evaluate("performance.mark('CLICK')")
    t0 = time.perf_counter()
    action()
    wait()
    wall = time.perf_counter() - t0
    page.wait_for_timeout(1500)
    cdp.send("Tracing.end")
    while not done:
        page.wait_for_timeout(100)
    ev = chunks
    json.dump(ev, open(f"/tmp/ui6/trace-{label}.json", "w"))
    mark = [e for e in ev if e.get("name") == "CLICK"]
    base = mark[0]["ts"] if mark else min(e["ts"] for e in ev if e.get("ts"))
    main_tid = collections.Counter(e["tid"] for e in ev if e.get("name") == "RunTask" and e.get("dur", 0) > 10000).most_common(1)[0][0]
    print(f"=== {label}: wall {wall:.2f} s")
    tasks = [e for e in ev if e.get("tid") == main_tid and e.get("ph") == "X" and e.get("name") == "RunTask" and e.get("dur", 0) > 15000 and e["ts"] >= base - 1000]
    kids = [e for e in ev if e.get("tid") == main_tid and e.get("ph") == "X" and e.get("dur", 0) > 3000 and e.get("name") != "RunTask"]
    for t in tasks:
        print(f"  task at {(t['ts']-base)/1000:7.1f} ms for {t['dur']/1000:6.1f} ms")
        inside = [k for k in kids if t["ts"] <= k["ts"] < t["ts"] + t["dur"]]
        agg = collections.defaultdict(float)
        for k in inside:
            nm = k["name"]
            if nm in ("FunctionCall", "EvaluateScript", "V8.Execute", "v8.callFunction", "EventDispatch", "TimerFire", "FireAnimationFrame", "v8.run", "V8.ParseFunctions"):
                continue
            agg[nm] += k["dur"] / 1000
        print("     ", ", ".join(f"{n} {v:.0f}" for n, v in sorted(agg.items(), key=lambda x: -x[1])[:8]))
        fc = [k for k in inside if k["name"] in ("FunctionCall", "EventDispatch", "TimerFire", "FireAnimationFrame")]
        for k in sorted(fc, key=lambda k: -k["dur"])[:4]:
            d = k.get("args", {}).get("data", {})
            print(f"        {k['name']} {k['dur']/1000:.0f} ms {d.get('functionName','')} {d.get('type','')} {str(d.get('url',''))[-40:]}:{d.get('lineNumber','')}")
    # JS self time from the cpu profile samples
    prof = {}
    samples = []
    for e in ev:
        if e.get("name") == "ProfileChunk":
            d = e["args"]["data"]
            cp = d.get("cpuProfile", {})
            for n in cp.get("nodes", []):
                prof[n["id"]] = n["callFrame"]
            samples += list(zip(cp.get("samples", []), d.get("timeDeltas", [])))
    self_t = collections.Counter()
    for s, dt in samples:
        cf = prof.get(s, {})
        self_t[(cf.get("functionName") or "(anon)") + " " + cf.get("url", "")[-30:] + ":" + str(cf.get("lineNumber", ""))] += dt / 1000
    print("  JS self time (ms):", "; ".join(f"{k} {v:.0f}" for k, v in self_t.most_common(14)))

def main():
    db = Path("/tmp/ui6/runs.db"); rid = Path("/tmp/ui6/wid").read_text().strip()
    script = Path(os.environ.get("APP", "app.py"))
    with running_app(db, Path("/tmp/ui6/app.log"), script=script) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        cdp = page.context.new_cdp_session(page)
        for k in range(2):
            page.goto(url)
            page.get_by_role("tab", name="History").click()
            page.wait_for_function("id => (document.querySelector('#hist-table') || {}).innerText?.includes(id)", arg=rid, timeout=60000)
            page.fill("#hist-run-id textarea, #hist-run-id input", rid)
            page.wait_for_timeout(1500)
            trace(page, cdp, lambda: page.click("#hist-open"), lambda: page.wait_for_function(WL_READY, polling="raf"), f"open{k}")
            trace(page, cdp, lambda: page.locator("#hist-wl-prompts tbody tr").nth(50).click(),
                  lambda: page.wait_for_selector("#hist-panes .pt-root[data-init]"), f"row{k}")
main()
