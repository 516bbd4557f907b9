import tempfile, collections
from parity_ui.ui.app import create_app
from parity_ui.ui.runner import AppService
r = AppService(tempfile.mkdtemp() + "/runs.db")
app = create_app(r)
cfg = app.config
comps = {c["id"]: c for c in cfg["components"]}
layout = {"tabs", "tabitem", "column", "row", "group", "accordion", "form", "box"}
# children count per container
layout_tree = cfg["layout"]
def count(node):
    return 1 + sum(count(c) for c in node.get("children", []))
sizes = {}
def walk(node):
    sizes[node["id"]] = count(node)
    for c in node.get("children", []): walk(c)
walk(layout_tree)
print("components:", len(comps), "deps:", len(cfg["dependencies"]))
for d in cfg["dependencies"]:
    if not d["backend_fn"]: continue
    ids = d["inputs"] + d["outputs"]
    conts = [(comps[i]["type"], comps[i]["props"].get("elem_id"), sizes.get(i)) for i in ids if comps[i]["type"] in layout]
    if conts:
        print(d["id"], d.get("api_name"), [(comps[t]["type"] if t in comps else t, e) for t, e in d["targets"]], conts)
r.close()
