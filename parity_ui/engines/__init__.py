"""The engines. Each runs inside its own worker process (parity_ui.workers); importing this
package imports neither torch nor vllm: `load_engine` imports the chosen backend on demand."""
from __future__ import annotations

import importlib

from .base import Engine

_BACKENDS = {"vllm": "parity_ui.engines.vllm_engine:VllmEngine",
             "hf": "parity_ui.engines.hf_engine:HfEngine"}


def load_engine(name: str) -> Engine:
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["Engine", "load_engine"]
