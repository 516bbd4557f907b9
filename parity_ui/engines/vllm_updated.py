"""A vLLM whose weights were pushed in flight (issue 41): it loads `start_from` (checkpoint A), then
receives the side's model (checkpoint B) through vLLM's own update path, the way an RL trainer pushes
weights between steps (parity_ui.engines.weight_push), optionally around a sleep/wake cycle and with
chosen tensors left out or zeroed. Everything else is the plain vLLM side: it generates, scores and
answers the weights verbs as one.

Before anything loads, `check` reads both checkpoints' config.json and safetensors headers
(parity_ui.inputs.checkpoints): another architecture or shape, a tensor B has that A has not (the
engine, built from A, has no place for it) and a tensor that changes shape are named there.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..core.types import EngineInfo
from ..core.weights import SideWeights, UpdateRecord
from .base import LoadRequest, Problem
from .vllm_engine import VllmEngine


class VllmUpdatedEngine(VllmEngine):
    kind = "vllm-updated"

    def __init__(self) -> None:
        super().__init__()
        self.update: UpdateRecord | None = None

    def check(self, req: LoadRequest) -> list[Problem]:
        from ..core.errors import ParityError
        from ..inputs.checkpoints import compatibility

        u = req.args["update"]
        problems = []
        if not (Path(u["start_from"]) / "config.json").is_file():
            return [
                Problem(
                    "weights-start-from",
                    f"start_from {u['start_from']!r} is not a checkpoint folder (no config.json there)",
                    "give the folder of the checkpoint the engine starts from (config.json + .safetensors)",
                )
            ]
        try:
            c = compatibility(u["start_from"], u["pushed_from"])
        except ParityError as e:
            return [Problem("weights-checkpoint", e.message, e.fix)]
        fix = "push a checkpoint of the model the engine started from (the same architecture, shapes and tensor names)"
        problems += [Problem("weights-incompatible", m, fix) for m in c.errors]
        problems += [Problem("weights-not-pushed", m, "", severity="warning") for m in c.warnings]
        if problems and any(p.severity == "error" for p in problems):
            return problems
        return problems + super().check(req)

    def load(self, req: LoadRequest) -> EngineInfo:
        from .weight_push import push

        info = super().load(req)
        u = req.args["update"]
        self.progress(
            f"pushing {u['pushed_from']} through {u['path']}" + (f" around sleep({u['sleep']})" if u["sleep"] else "")
        )
        self.update = push(
            self.llm,
            u["pushed_from"],
            skip=u.get("skip"),
            zero=u.get("zero"),
            sleep=int(u.get("sleep") or 0),
            path=u["path"],
            start_from=u["start_from"],
        )
        info.resolved["update"] = (
            f"started from {u['start_from']}, pushed {self.update.pushed} tensors of {u['pushed_from']} "
            f"through {u['path']} in {self.update.seconds:.2f} s"
            + (f", {len(self.update.skipped)} left out" if self.update.skipped else "")
            + (f", {len(self.update.zeroed)} zeroed" if self.update.zeroed else "")
            + (f", sleep level {self.update.sleep}" if self.update.sleep else "")
        )
        return info

    def weights(self, req: Any) -> SideWeights:
        out = super().weights(req)
        out.update = UpdateRecord(**asdict(self.update)) if self.update is not None else None
        return out
