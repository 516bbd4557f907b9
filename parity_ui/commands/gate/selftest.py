"""`parity check --self-test`: a built-in spec that proves, on the machine at hand, that a gate
passes where it should and fails where it must: HF float32 against vLLM float32 on the demo model
(or --model), and as its control the vLLM side in bfloat16, which the same thresholds must fail.
On the CPU it runs 3 prompts of 8 tokens; on a GPU 16 prompts of 64.
"""

from __future__ import annotations

import json

from .spec import GateSpec, parse_spec

PROMPTS = [
    "Give me a brief explanation of gravity in simple terms.",
    "Write a haiku about the sea.",
    "What is the capital of France? Answer in one sentence.",
    "List three prime numbers and explain why they are prime.",
    "Describe how a bicycle works.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Write a Python function that reverses a string.",
    "What are the three states of matter?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "How do vaccines train the immune system?",
    "Name four planets of the solar system.",
    "What does a compiler do?",
    "Give two tips for a good night's sleep.",
    "Explain photosynthesis to a ten-year-old.",
    "What is the difference between weather and climate?",
]

SPEC = """\
cases:
  - name: self-test-fp32
    model: ${SELFTEST_MODEL}
    sides:
      - {name: ref, kind: hf, dtype: float32}
      - {name: vllm, kind: vllm, dtype: float32}
    prompts: {texts: @PROMPTS@}
    config: {max_new_tokens: "${SELFTEST_TOKENS}", chat: true, ignore_eos: true}
    floor: none
    thresholds:
      abs_dlogp_p99: 0.02      # float32 against float32: rounding only
      k1: 0.005
    control:
      set: {vllm.dtype: bfloat16}   # the same thresholds must fail on bf16
"""


def self_test_spec(model: str = "demo", gpu: bool = False) -> GateSpec:
    n, tokens = (16, 64) if gpu else (3, 8)
    env = {"SELFTEST_MODEL": model, "SELFTEST_TOKENS": str(tokens)}
    # JSON strings are YAML flow scalars: the prompts go in as one flow list.
    return parse_spec(SPEC.replace("@PROMPTS@", json.dumps(PROMPTS[:n])), "(built-in self-test)", env=env)
