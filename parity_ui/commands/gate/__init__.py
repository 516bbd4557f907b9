"""`parity check`: a CI gate over workload runs: a YAML spec of cases (spec), their thresholds,
baseline corridor and control (judge, check), and the outputs CI systems read (junit, summary).
Nothing here imports an engine."""

from __future__ import annotations

__all__ = ["spec", "check", "judge", "junit", "summary", "record", "perturb", "selftest", "metrics"]
