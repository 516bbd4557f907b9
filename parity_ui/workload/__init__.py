"""Parity over a whole workload: many prompts read from one file, pooled statistics.

The modules are imported one by one (`parity_ui.workload.source`, ...); this package imports none of
them, so importing it pulls in nothing heavy (pyarrow, for one, is imported only to read a .parquet).
"""
