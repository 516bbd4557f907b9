"""The commands, one module (or package) each: a comparison, a workload, probes and sweeps, a layer
localisation, a bisect (which setting?), the gate. Each takes the service through the Protocol in
service_api (never the ParityService itself) and is reached from outside only through a method of
parity_ui.service.ParityService.

May import: core, inputs, analysis, run, store, measures.
"""
