"""The test scheduler's scopes (tests/conftest.py's xdist scheduler): which modules share a test process,
and the order the scopes are handed out in. Here rather than in conftest.py so that a test can import it
(`import conftest` finds whichever conftest.py pytest loaded last: tests/browser/ has one too)."""
from __future__ import annotations

from pathlib import Path

# `make test` runs two test processes (pytest -n 2, pytest-xdist): a module's tests stay in one process,
# in order, so its module-scoped fixtures (a warm engine, an audit its tests read, an app) are made
# once as in one process; each process has its own session service and warm workers. The modules that
# start a real Ray instance share one scope (one process, one after the other): two local Ray clusters
# on a 2-core machine at once fight over it. So do modules that share costly warm workers (SHARED_SCOPES).
# (xdist's own `xdist_group` marker renames node ids in a way pytest 9 ignores, hence a scheduler.)
RAY_MODULES = {"test_cluster.py", "test_cluster_engines.py", "test_cluster_placement.py"}
# Modules that share one process because they share warm workers that cost most to start: the demo
# model's (SmolLM2-135M: its vLLM and HF workers in float32) serve test_engines.py's demo tests and then,
# still warm (KEEP_IDLE), test_gate_engines.py's gate cases; in two processes both would start them.
SHARED_SCOPES = {"test_engines.py": "demo", "test_gate_engines.py": "demo", **dict.fromkeys(RAY_MODULES, "ray")}


# The order modules are handed out in: the long ones first (a real Ray instance, then the engines, then
# the browser), the unit modules (many, short) last, to fill the tail so both processes end together.
# xdist would otherwise put the scopes with the most tests first: the unit modules, leaving the engine
# modules for the end.
SCOPE_RANK = {"ray": 0, "demo": 1, "engines": 1, "browser": 2}


def scope(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return SHARED_SCOPES.get(Path(module).name, module)


def scope_rank(name: str) -> int:
    return SCOPE_RANK.get(name if name in SCOPE_RANK else Path(name).parent.name, 3)
