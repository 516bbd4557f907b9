"""The types of a prepared run: what was asked for, and each side's plan. Plain dataclasses, so the
modules that read a plan (preflight, the memory plan, the service) need not import what makes it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..core.config import ParityConfig
from ..core.kinds import Kind
from ..core.mapping import Resolved
from ..core.sides import SideSpec
from ..core.types import EngineInfo, Finding, ModelInfo
from ..inputs.prompts import EncodedPrompt, PromptSpec, PromptTokenizer
from .environments import PythonEnv
from .workers import load_key


@dataclass
class RunRequest:
    model: str
    prompts: list[PromptSpec]
    config: ParityConfig
    trust_remote_code: bool = False
    group_id: str | None = None
    kind: str = "compare"
    # Positions every side must serve whatever the prompts need: a caller that feeds a side longer ids
    # than `prompts` (a layer capture of a stored run's prompt and tokens) says how many here.
    min_context: int = 0
    # A prompt longer than the context: "stop" refuses the run (PromptError), "skip" leaves the prompt
    # out and counts it (Prepared.skipped_too_long), as a workload over many prompts wants.
    too_long: str = "stop"


@dataclass
class SidePlan:
    """One side, ready to start: what it loads, where and with which interpreter."""

    spec: SideSpec
    kind: Kind
    model: ModelInfo  # the side's own model folder, or the run's
    dtype: str
    args: Any  # the kind's *Args from parity_ui.core.mapping
    python: str  # the worker's interpreter
    env: PythonEnv | None  # facts about that interpreter (None: this one, not probed)
    worker_env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def load_args(self) -> dict[str, Any]:
        """The mapper's output as plain data for the worker (another environment cannot unpickle
        parity_ui.core.mapping's classes)."""
        data = dataclasses.asdict(self.args)
        data.pop("used", None)
        return data

    @property
    def load_key(self) -> str:
        """What a warm worker must have loaded to serve this side. The sampling settings travel with
        every generate request, so changing max_new_tokens or temperature reuses the worker."""
        return self._key_of(self._loaded_args())

    def _loaded_args(self) -> dict[str, Any]:
        args = self.load_args()
        args.pop("sampling", None)
        return args

    def _key_of(self, args: dict[str, Any]) -> str:
        return load_key(self.kind.name, self.python, self.worker_env, self.model.path, args)

    def stand_ins(self) -> list[tuple[str, str, str]]:
        """Other setups whose warm worker may serve this side: (their load key, the option, this side's
        value of it); the worker serves it where its EngineInfo.serves_also says so for that value.
        Today one option: vLLM's forced_tokens, "auto" and "prompt" (alike where trace replay cannot run)."""
        args = self._loaded_args()
        mine = args.get("forced_tokens")
        if mine not in ("auto", "prompt"):
            return []
        return [
            (self._key_of({**args, "forced_tokens": "prompt" if mine == "auto" else "auto"}), "forced_tokens", mine)
        ]

    def served_info(self, info: EngineInfo, key: str) -> EngineInfo:
        """What this side reads of the engine behind worker `key`: the engine's own info, or, where the
        worker stands in for this side's setup (stand_ins), that info with the rows the engine resolves
        for this side's values (EngineInfo.serves_also)."""
        if not info.serves_also:  # the common case: the side's own worker, or an engine that serves nothing else
            return info
        for alt, option, value in self.stand_ins():
            row = info.serves_also.get(option, {}).get(value) if alt == key else None
            if row is not None:
                return dataclasses.replace(info, resolved={**info.resolved, option: row})
        return info


@dataclass
class Prepared:
    config: ParityConfig
    model: ModelInfo
    tokenizer: PromptTokenizer
    prompts: list[EncodedPrompt]
    resolved: Resolved
    sides: list[SidePlan]  # the reference first
    max_context: int | None
    warnings: list[Finding] = field(default_factory=list)
    # Image prompts: a side whose resize settings differ from the reference's (a user reproducing the
    # resize trap) gets the ids the same processor makes under ITS settings; every other side `prompts`.
    side_prompts: dict[str, list[EncodedPrompt]] = field(default_factory=dict)
    image_token_id: int | None = None
    # The request's prompts each of `prompts` is (its index there), and those left out as too long.
    kept: list[int] = field(default_factory=list)
    skipped_too_long: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.kept:
            self.kept = list(range(len(self.prompts)))

    def side(self, name: str) -> SidePlan:
        return next(s for s in self.sides if s.name == name)

    def prompts_of(self, side: str) -> list[EncodedPrompt]:
        return self.side_prompts.get(side, self.prompts)

    @property
    def has_images(self) -> bool:
        return any(e.images for e in self.prompts)

    @property
    def reference(self) -> SidePlan:
        return self.sides[0]
