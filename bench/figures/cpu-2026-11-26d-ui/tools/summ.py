import json, collections, sys
ev = json.load(open(sys.argv[1]))
mark = [e for e in ev if e.get("name") == "CLICK"]
base = mark[0]["ts"]
main_tid = collections.Counter(e["tid"] for e in ev if e.get("name") == "RunTask" and e.get("dur", 0) > 10000).most_common(1)[0][0]
tasks = [e for e in ev if e.get("tid") == main_tid and e.get("ph") == "X" and e.get("name") == "RunTask" and e.get("dur", 0) > 15000 and e["ts"] >= base - 1000]
for t in tasks: print(f"task {(t['ts']-base)/1000:7.1f} ms for {t['dur']/1000:6.1f}")
# cpu profile self time by window
prof = {}; samples = []; t = None
for e in ev:
    if e.get("name") == "Profile":
        t = e["args"]["data"].get("startTime")
    if e.get("name") == "ProfileChunk":
        d = e["args"]["data"]; cp = d.get("cpuProfile", {})
        for n in cp.get("nodes", []): prof[n["id"]] = n
        samples += list(zip(cp.get("samples", []), d.get("timeDeltas", [])))
# parents
parent = {}
for i, n in prof.items():
    p = n.get("parent")
    if p: parent[i] = p
win = float(sys.argv[2]) if len(sys.argv) > 2 else 0; win2 = float(sys.argv[3]) if len(sys.argv) > 3 else 1e9
ts = t; self_t = collections.Counter(); incl = collections.Counter()
for s, dt in samples:
    ts += dt
    rel = (ts - base) / 1000
    if not (win <= rel < win2): continue
    cf = prof[s]["callFrame"]
    self_t[(cf.get("functionName") or "(anon)") + " " + cf.get("url", "")[-28:] + ":" + str(cf.get("lineNumber", "")) + ":" + str(cf.get("columnNumber", ""))] += dt / 1000
    seen = set(); i = s
    while i:
        cf = prof[i]["callFrame"]; k = (cf.get("functionName") or "(anon)") + " " + cf.get("url", "")[-28:] + ":" + str(cf.get("lineNumber", "")) + ":" + str(cf.get("columnNumber", ""))
        if k not in seen: incl[k] += dt / 1000; seen.add(k)
        i = parent.get(i)
print("SELF:"); [print(f"  {v:6.0f} {k}") for k, v in self_t.most_common(15)]
print("INCL:"); [print(f"  {v:6.0f} {k}") for k, v in incl.most_common(40)]
