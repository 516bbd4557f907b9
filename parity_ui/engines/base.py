"""The interface both engines implement, with the same method names and the same result shapes.

Engine-native arguments never cross this boundary as loose kwargs: `load` takes the mapper's
output for that engine, `generate` the prompt ids and the per-engine sampling arguments.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from ..types import EngineInfo, EngineResult, EngineName, TokenStep, TopLogprob

StepCallback = Callable[[int, TokenStep], None]  # (prompt index, step) as tokens are made
ShouldStop = Callable[[], bool]


@dataclass
class GenerateRequest:
    prompts: list[list[int]]  # token ids, already templated/tokenized ONCE by the service
    sampling: dict[str, Any]  # the mapper's output for this engine
    batch_size: int = 1
    logprobs: int = 5
    stream: bool = True


@dataclass
class ScoreRequest:
    """Teacher forcing: the logprob of each `continuation` token given the prompt and the
    continuation before it, plus the engine's own top-k there."""

    prompt: list[int]
    continuation: list[int]
    logprobs: int = 5


@dataclass
class LoadRequest:
    args: Any  # VllmArgs or HfArgs
    model_path: str
    env: dict[str, str] = field(default_factory=dict)


class Engine(ABC):
    name: EngineName

    @abstractmethod
    def load(self, req: LoadRequest) -> EngineInfo:
        """Load the model; raises on failure (the worker reports it)."""

    @abstractmethod
    def generate(self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop) -> list[EngineResult]:
        """Generate for every prompt; results in prompt order. Stops early when should_stop()."""

    @abstractmethod
    def score(self, req: ScoreRequest) -> list[TokenStep]:
        """One TokenStep per continuation token, scored with this engine's forward pass."""


def clean_logprob(x: float) -> float:
    """-inf (a masked token) is kept as a very negative finite number so JSON can carry it."""
    return x if math.isfinite(x) else -1e30


def make_step(position: int, token_id: int, logprob: float | None, rank: int | None,
              top: list[tuple[int, float]]) -> TokenStep:
    return TokenStep(
        position=position, token_id=int(token_id),
        text="",  # filled by the service with ONE tokenizer, so both panes decode alike
        logprob=None if logprob is None else clean_logprob(float(logprob)),
        rank=rank,
        top=[TopLogprob(int(t), clean_logprob(float(lp)), "") for t, lp in top],
    )
