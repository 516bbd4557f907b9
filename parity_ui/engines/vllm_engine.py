"""vLLM's offline engine, driven step by step so tokens stream as they are made.

Runs only inside a worker process. The engine core is kept in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0): the worker is already isolated, and it starts 5-10x faster.
"""
from __future__ import annotations

import itertools
import os
import platform
import time
from typing import Any

from ..types import EngineInfo, EngineResult, TokenStep
from .base import Engine, GenerateRequest, LoadRequest, ScoreRequest, ShouldStop, StepCallback, make_step

_ids = itertools.count()


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda:0 ({torch.cuda.get_device_name(0)})"
    return f"cpu ({platform.machine()})"


def _step_from_logprobs(position: int, token_id: int, entry: dict[int, Any] | None, k: int) -> TokenStep:
    if not entry:
        return make_step(position, token_id, None, None, [])
    chosen = entry.get(token_id)
    ranked = sorted(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
    top = [(tid, lp.logprob) for tid, lp in ranked if lp.rank is not None and lp.rank <= k][:k]
    return make_step(position, token_id, chosen.logprob if chosen else None,
                     chosen.rank if chosen else None, top)


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self) -> None:
        self.llm: Any = None

    def load(self, req: LoadRequest) -> EngineInfo:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.update(req.env)
        import torch
        import vllm
        from vllm import LLM

        self.llm = LLM(**req.args.llm)
        mc = self.llm.llm_engine.model_config
        return EngineInfo(
            name="vllm", version=vllm.__version__, device=_device_name(),
            dtype=str(mc.dtype).replace("torch.", ""), torch_version=torch.__version__,
            details={"max_model_len": mc.max_model_len,
                     "enforce_eager": bool(req.args.llm.get("enforce_eager")),
                     "batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT") == "1"},
        )

    def _sampling(self, sampling: dict[str, Any], **extra: Any) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = SamplingParams(**{**sampling, **extra})
        sp.output_kind = RequestOutputKind.DELTA  # each step brings only the new tokens
        return sp

    def generate(self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop) -> list[EngineResult]:
        engine = self.llm.llm_engine
        results = [EngineResult(engine="vllm", prompt_index=i) for i in range(len(req.prompts))]
        for start in range(0, len(req.prompts), req.batch_size):
            chunk = range(start, min(start + req.batch_size, len(req.prompts)))
            t0 = time.perf_counter()
            rid_to_idx: dict[str, int] = {}
            for i in chunk:
                rid = f"parity-{next(_ids)}"
                rid_to_idx[rid] = i
                engine.add_request(rid, {"prompt_token_ids": req.prompts[i]}, self._sampling(req.sampling))
            while engine.has_unfinished_requests():
                if should_stop():
                    engine.abort_request(list(rid_to_idx))
                    for i in chunk:
                        if results[i].finish_reason is None:
                            results[i].finish_reason = "cancelled"
                    break
                for out in engine.step():
                    i = rid_to_idx.get(out.request_id)
                    if i is None:
                        continue
                    res, comp = results[i], out.outputs[0]
                    now = time.perf_counter() - t0
                    lps = comp.logprobs or [None] * len(comp.token_ids)
                    for tid, entry in zip(comp.token_ids, lps):
                        step = _step_from_logprobs(len(res.steps), tid, entry, req.logprobs)
                        res.steps.append(step)
                        res.token_ids.append(step.token_id)
                        if res.timings.prefill_s is None:
                            res.timings.prefill_s = now
                        if req.stream:
                            on_step(i, step)
                    if out.finished:
                        res.finish_reason = comp.finish_reason
                        res.timings.total_s = now
        return results

    def score(self, req: ScoreRequest) -> list[TokenStep]:
        ids = req.prompt + req.continuation
        sp = self._sampling({"max_tokens": 1, "temperature": 0.0, "skip_special_tokens": False},
                            prompt_logprobs=max(req.logprobs, 1))
        engine = self.llm.llm_engine
        rid = f"score-{next(_ids)}"
        engine.add_request(rid, {"prompt_token_ids": ids}, sp)
        prompt_lps = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == rid and out.prompt_logprobs is not None:
                    prompt_lps = (prompt_lps or []) + list(out.prompt_logprobs)
        if prompt_lps is None:
            raise RuntimeError("vLLM returned no prompt_logprobs")
        # prompt_logprobs[j] scores ids[j] given ids[:j] (entry 0 is None).
        base = len(req.prompt)
        return [_step_from_logprobs(j, req.continuation[j], prompt_lps[base + j], req.logprobs)
                for j in range(len(req.continuation))]
