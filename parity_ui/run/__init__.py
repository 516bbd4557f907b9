"""From a request to loaded engines: each side's plan (prepare, preflight, the GPU memory plan,
another environment's interpreter), the worker processes and their typed verbs, the per-side pipeline,
and the run's record while it is made (recorder).

May import: core, inputs, engines, store.
"""
