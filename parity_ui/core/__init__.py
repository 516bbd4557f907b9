"""The vocabulary every layer shares: the canonical config and its sides and kinds, the mapping to each
engine's native arguments, the requests an engine is asked, and the typed records that flow end to end
(a side's steps, a comparison, a run, findings, a workload's and a bisect's record, the pooled figures).

Pure: no engine, no worker, no SQL, no HTML. May import: nothing else of parity_ui.
"""
