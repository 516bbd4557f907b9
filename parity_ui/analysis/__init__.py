"""Pure analysis of what sides produced: the token-level comparison, the verdict at a fork
(explain), teacher-forced cross-scores, the sliding-window check, delta debugging.

No I/O, no engines.

May import: core.
"""
