"""The built-in prompt set of an audit: N prompts of mixed lengths, from a few dozen words to `longest`,
each opening with its own header (so no two share a first KV block: a cold pass stays cold) and made
of plain sentences, the same on every machine.

Mixed lengths matter: in one padded batch a short prompt is the padded one (HF), in one vLLM batch long
and short prefills share steps, and only a prompt longer than a chunk budget is chunked.
"""

from __future__ import annotations

from .prompts import PromptSpec

_TOPICS = (
    "tides",
    "bridges",
    "bees",
    "volcanoes",
    "the printing press",
    "compound interest",
    "photosynthesis",
    "jazz",
    "chess openings",
    "vaccines",
    "rainbows",
    "the Roman roads",
)
_SENTENCES = (
    "The first record of it is older than most people expect, and the details are still argued over.",
    "Engineers measured it again and again, because every new instrument gave a slightly different number.",
    "A careful reader notices that the same idea returns in different forms across many centuries.",
    "Small changes at the start grow into large differences later, which is why the order of steps matters.",
    "Teachers often explain it with a simple picture, then spend weeks undoing the simplification.",
    "The numbers look stable from far away, yet each one hides a long list of assumptions.",
    "Some of the most useful observations were made by people who were looking for something else.",
    "It is easy to describe in one sentence and surprisingly hard to reproduce exactly.",
    "When two careful people repeat the same procedure, they rarely get results that agree to the last digit.",
    "The history is a sequence of corrections, each one small, each one argued for in public.",
)

DEFAULT_N = 8
DEFAULT_LONGEST_WORDS = 600


def builtin_prompts(n: int = DEFAULT_N, longest_words: int = DEFAULT_LONGEST_WORDS) -> list[PromptSpec]:
    """`n` prompts whose lengths grow geometrically from ~12 words to about `longest_words` (the last
    one the longest: the chunked-prefill axis's long prompt)."""
    n = max(1, int(n))
    longest_words = max(16, int(longest_words))
    shortest = 12
    out = []
    for i in range(n):
        frac = i / (n - 1) if n > 1 else 1.0
        words = int(round(shortest * (longest_words / shortest) ** frac))
        topic = _TOPICS[i % len(_TOPICS)]
        head = f"Note {i + 1} of {n}, about {topic}:"
        body: list[str] = []
        k = i
        while sum(len(s.split()) for s in body) + len(head.split()) < words:
            body.append(_SENTENCES[k % len(_SENTENCES)])
            k += 3
        text = " ".join([head, *body]) + f" In one sentence, what matters most about {topic}?"
        out.append(PromptSpec(text=text))
    return out


def describe_builtin(n: int, longest_words: int) -> str:
    return f"the built-in set of {n} prompts of mixed lengths (up to ~{longest_words} words)"
