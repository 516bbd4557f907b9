"""The live view of a run in progress: RunEvents in, progress card and token panes out.

Pure (no gradio): the Compare tab feeds it the service's events from a queue and renders it at a
throttled rate.
"""
from __future__ import annotations

import time

from ..service import RunEvent
from ..types import TokenStep
from .cards import progress_html
from .tokens import first_difference, panes_html


class LiveRun:
    def __init__(self, n_prompts: int, max_new_tokens: int | None):
        self.n_prompts = n_prompts
        self.max_new_tokens = max_new_tokens
        self.steps: dict[str, dict[int, list[TokenStep]]] = {"vllm": {}, "hf": {}}
        self.phase = "Queued: waiting for the engines"
        self.log: list[str] = []
        self.t0 = time.monotonic()
        self.first_token_s: float | None = None

    def feed(self, ev: RunEvent) -> None:
        if ev.kind == "token" and ev.engine in self.steps and ev.step is not None:
            if self.first_token_s is None:
                self.first_token_s = time.monotonic() - self.t0
            self.steps[ev.engine].setdefault(ev.prompt_index or 0, []).append(ev.step)
            return
        if ev.message:
            self.log.append(ev.message)
        if ev.kind == "status":
            m = ev.message
            if m.startswith("preparing"):
                self.phase = "Preparing: model, tokenizer, config"
            elif m.startswith("loading"):
                self.phase = "Loading both engines (a warm engine is reused)"
            elif ev.engine == "vllm":
                self.phase = "vLLM: prefill and generating"
            elif ev.engine == "hf":
                self.phase = "HF transformers: prefill and generating"
            elif m.startswith("stored"):
                self.phase = "Comparing and storing"

    def counts(self) -> dict[str, int]:
        return {name: sum(len(v) for v in per.values()) for name, per in self.steps.items()}

    def progress(self) -> str:
        expected = self.max_new_tokens * self.n_prompts if self.max_new_tokens else None
        return progress_html(self.phase, self.log, self.counts(), expected, time.monotonic() - self.t0)

    def panes(self, prompt_index: int = 0) -> str:
        v = self.steps["vllm"].get(prompt_index, [])
        h = self.steps["hf"].get(prompt_index, [])
        div = first_difference([s.token_id for s in v], [s.token_id for s in h], finished=False)
        note = "Streaming as the engines generate (vLLM first, then HF)"
        note += f": prompt {prompt_index} of {self.n_prompts}." if self.n_prompts > 1 else "."
        return panes_html(v, h, divergence=div, live=True, note=note)
