"""Hugging Face transformers `generate`, with logprobs rebuilt from RAW logits.

Runs only inside a worker process. Logprobs are log_softmax(float32(logits)) of `output_logits`,
as vLLM's own test suite does, never generate's processed `scores` (unless the config asks for
processed logprobs, to match vLLM's processed_logprobs mode).
"""
from __future__ import annotations

import platform
import time
from typing import Any

from ..types import EngineInfo, EngineResult, EngineTimings, TokenStep
from .base import Engine, GenerateRequest, LoadRequest, ScoreRequest, ShouldStop, StepCallback, make_step


class HfEngine(Engine):
    name = "hf"

    def __init__(self) -> None:
        self.model: Any = None
        self.args: Any = None

    def load(self, req: LoadRequest) -> EngineInfo:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

        a = self.args = req.args
        config = AutoConfig.from_pretrained(req.model_path, trust_remote_code=a.load["trust_remote_code"])
        for key, value in a.config_overrides.items():
            setattr(config, key, value)
        kwargs = {**a.load, "dtype": getattr(torch, a.load["dtype"])}
        model = AutoModelForCausalLM.from_pretrained(req.model_path, config=config, **kwargs)
        model.to(a.device).eval()
        if not a.keep_model_generation_config:
            # generate() fills every None field from model.generation_config, then from global
            # defaults. A neutral one (no sampling values, and no EOS: the mapper passes the EOS ids
            # explicitly, and ignore_eos must not get them back) keeps the model's
            # generation_config.json out of the run.
            model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id,
                                                       pad_token_id=config.pad_token_id)
        self.model = model
        dev = str(model.device)
        if dev.startswith("cuda"):
            dev = f"{dev} ({torch.cuda.get_device_name(model.device)})"
        else:
            dev = f"cpu ({platform.machine()})"
        return EngineInfo(name="hf", version=transformers.__version__, device=dev,
                          dtype=str(model.dtype).replace("torch.", ""), torch_version=torch.__version__,
                          details={"attn_implementation": getattr(model.config, "_attn_implementation", None)})

    def _steps_from_logits(self, logits: list[Any], row: int, tokens: list[int], k: int) -> list[TokenStep]:
        import torch

        steps = []
        for i, tid in enumerate(tokens):
            lp = torch.log_softmax(logits[i][row].float(), dim=-1)
            chosen = lp[tid].item()
            rank = int((lp > chosen).sum().item()) + 1
            top_v, top_i = torch.topk(lp, k)
            steps.append(make_step(i, tid, chosen, rank, list(zip(top_i.tolist(), top_v.tolist()))))
        return steps

    def generate(self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop) -> list[EngineResult]:
        import torch
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        a = self.args
        gen = dict(req.sampling)
        stops = set(gen.get("eos_token_id") or [])
        results: list[EngineResult] = []
        k = max(req.logprobs, 1)

        class _Cancel(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
                return torch.full((input_ids.shape[0],), should_stop(), dtype=torch.bool, device=input_ids.device)

        for start in range(0, len(req.prompts), req.batch_size):
            chunk = list(range(start, min(start + req.batch_size, len(req.prompts))))
            width = max(len(req.prompts[i]) for i in chunk)
            pad = gen["pad_token_id"]
            # Left padding: every row's next token sits at the same column.
            ids = torch.tensor([[pad] * (width - len(req.prompts[i])) + req.prompts[i] for i in chunk])
            mask = torch.tensor([[0] * (width - len(req.prompts[i])) + [1] * len(req.prompts[i]) for i in chunk])
            t0 = time.perf_counter()
            first: list[float | None] = [None]
            streamed = [0] * len(chunk)
            done = [False] * len(chunk)

            class _Stream(BaseStreamer):
                primed = False

                def put(self, value: Any) -> None:
                    if not self.primed:  # generate() first hands over the prompt
                        self.primed = True
                        return
                    if first[0] is None:
                        first[0] = time.perf_counter() - t0
                    if not req.stream:
                        return
                    for row, tid in enumerate(value.view(-1).tolist()):
                        if done[row]:
                            continue
                        on_step(chunk[row], make_step(streamed[row], tid, None, None, []))
                        streamed[row] += 1
                        if tid in stops:
                            done[row] = True

                def end(self) -> None:
                    pass

            if a.seed is not None:
                torch.manual_seed(a.seed)
            gc = GenerationConfig(**gen, return_dict_in_generate=True,
                                  output_logits=a.logprobs_source == "logits",
                                  output_scores=a.logprobs_source == "scores")
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=ids.to(self.model.device), attention_mask=mask.to(self.model.device),
                    generation_config=gc, streamer=_Stream(),
                    stopping_criteria=StoppingCriteriaList([_Cancel()]),
                )
            total = time.perf_counter() - t0
            logits = out.logits if a.logprobs_source == "logits" else out.scores
            cancelled = should_stop()
            for row, i in enumerate(chunk):
                new = out.sequences[row, width:].tolist()
                tokens, reason = [], "length"
                for tid in new:
                    tokens.append(tid)
                    if tid in stops:
                        reason = "stop"
                        break
                if cancelled and reason == "length" and len(tokens) < gen["max_new_tokens"]:
                    reason = "cancelled"
                steps = self._steps_from_logits(logits, row, tokens, k)
                results.append(EngineResult(
                    engine="hf", prompt_index=i, token_ids=tokens, steps=steps, finish_reason=reason,
                    timings=EngineTimings(prefill_s=first[0], total_s=total)))
        return results

    def score(self, req: ScoreRequest) -> list[TokenStep]:
        import torch

        ids = torch.tensor([req.prompt + req.continuation], device=self.model.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0]
        base = len(req.prompt)
        # logits[j] predicts ids[j + 1]: continuation token j is predicted at base - 1 + j.
        rows = [logits[base - 1 + j].unsqueeze(0) for j in range(len(req.continuation))]
        return self._steps_from_logits(rows, 0, req.continuation, max(req.logprobs, 1))
