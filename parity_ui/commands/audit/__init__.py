"""`parity audit` (issue 40): certify that an engine setup is invariant, bit for bit, on every axis it
promises (replay, batch, order, prefix cache, prefill vs decode, chunked prefill, a second instance,
CUDA graphs, async scheduling, TP, attention kernels), with a control that must fail.

run.py orchestrates; axes.py decides which axes a setup has and the second engines; passes.py is what
one loaded engine is asked; judge.py turns two sets of streams into an axis's verdict; pairs.py stores
a broken axis's streams as a run; evidence.py is what a certificate names. The built-in prompt set: parity_ui.inputs.audit_prompts.
"""

from ...inputs.audit_prompts import builtin_prompts, describe_builtin
from .axes import parse_axes
from .run import AuditOutcome, AuditRequest, run_audit

__all__ = ["AuditOutcome", "AuditRequest", "builtin_prompts", "describe_builtin", "parse_axes", "run_audit"]
