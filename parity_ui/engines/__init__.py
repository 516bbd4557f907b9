"""The engines. Each runs inside its own worker process (parity_ui.run.workers); importing this
package imports neither torch nor vllm: `load_engine` imports the chosen backend on demand, from
the "module:Class" its kind names.

May import: core, inputs."""

from __future__ import annotations

import importlib

from .base import Engine


def load_engine(path: str) -> Engine:
    """`path` is a kind's engine, "parity_ui.engines.vllm_engine:VllmEngine"."""
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["Engine", "load_engine"]
