"""runs.db, through sqlite-utils: the only package that speaks SQL.

- store: the `Store` the commands and the app are handed (the named reads and writes; why an object).
- runs: the ONE migration list (the gate's tables included), opening the file, a run and its parts.
- workloads: a workload's prompts as given and a chunk's rows. checks: the gate's records.
- legacy: rows an older release wrote, read as today's.

May import: core, inputs.
"""

from .store import Store, StoredReport

__all__ = ["Store", "StoredReport"]
