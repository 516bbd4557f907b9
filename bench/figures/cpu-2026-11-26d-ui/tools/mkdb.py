import sys, json, time
sys.argv=[sys.argv[0]]
sys.path.insert(0, "bench")
from ui_render import synthetic_workload, synthetic_run
from pathlib import Path
from parity_ui.store.runs import open_db, save_run
db = Path("/tmp/ui6/runs.db")
if db.exists(): db.unlink()
for r in (synthetic_run(16384), synthetic_run(16384, created="2025-12-31T00:00:00.000+00:00")):
    save_run(open_db(db), r)
w = synthetic_workload(open_db(db), 1000, 128, created="2025-12-01T00:00:00.000+00:00")
Path("/tmp/ui6/wid").write_text(w.id)
print(w.id)
