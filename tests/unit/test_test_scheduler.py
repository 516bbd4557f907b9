"""The test scheduler's scopes (tests/scheduling.py, used by tests/conftest.py): which modules share a
test process, and the order the scopes are handed out in. A wrong scope costs minutes (an engine started
twice) or breaks a run (two local Ray clusters at once on two cores), and nothing else would notice."""
from __future__ import annotations

from scheduling import RAY_MODULES, scope, scope_rank


def test_the_demo_models_modules_share_one_process_and_the_ray_modules_another():
    demo = {scope(f"tests/engines/{m}::test_x") for m in ("test_engines.py", "test_gate_engines.py")}
    ray = {scope(f"tests/{'engines' if 'engines' in m else 'unit'}/{m}::test_y") for m in RAY_MODULES}
    assert demo == {"demo"} and ray == {"ray"}
    assert scope("tests/engines/test_audit_engines.py::test_z") == "tests/engines/test_audit_engines.py"


def test_the_long_scopes_go_out_first_and_the_unit_modules_last():
    ranks = [scope_rank(s) for s in ("ray", "demo", "tests/engines/test_audit_engines.py",
                                      "tests/browser/test_browser.py", "tests/unit/test_store.py")]
    assert ranks == sorted(ranks) and ranks[0] < ranks[3] < ranks[4]
