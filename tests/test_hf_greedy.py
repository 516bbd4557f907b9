"""parity-ui's own greedy loop over an HF model (decode=graphed), in this process on the CPU, against
transformers' generate(): float32, so tokens must be identical and logprobs equal to rounding.
On the CPU the loop runs without the CUDA graph; the graph itself is verified on the lent H100
(bench/hf_decode.py, figures in the notes)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from parity_ui.engines.hf_greedy import GreedyDecoder, graph_problem  # noqa: E402
from tiny_models import build_model  # noqa: E402

pytestmark = pytest.mark.engines

PROMPT = list(range(5, 40))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = build_model(tmp_path_factory.mktemp("greedy") / "qwen2", "qwen2", seed=3)
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    m.generation_config = GenerationConfig(pad_token_id=0)
    return m


def _reference(model, prompt, n, eos=None):
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=n, do_sample=False, return_dict_in_generate=True, output_logits=True,
                          pad_token_id=0, eos_token_id=eos)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    tokens = out.sequences[0, len(prompt):].tolist()
    lps = [torch.log_softmax(x[0].float(), -1) for x in out.logits]
    return tokens, lps


def _decode(decoder, prompt, n, stops=(), stop_after=None):
    seen = []

    def should_stop():
        return stop_after is not None and len(seen) >= stop_after

    out = decoder.decode(prompt, n, set(stops), lambda i, tid: seen.append((i, tid)), should_stop)
    return out, seen


def test_tokens_logprobs_ranks_and_top_k_equal_generates(model):
    ref, lps = _reference(model, PROMPT, 40)
    out, seen = _decode(GreedyDecoder(model, 4), PROMPT, 40)
    assert out.tokens == ref and out.stopped == "length"
    assert seen == list(enumerate(ref))  # every token streamed once, in order
    for i, tid in enumerate(ref):
        assert out.chosen[i] == pytest.approx(lps[i][tid].item(), abs=1e-5)
        assert out.ranks[i] == int((lps[i] > lps[i][tid]).sum()) + 1 == 1
        top_v, top_i = torch.topk(lps[i], 4)
        assert [t for t, _ in out.top[i]] == top_i.tolist()
        assert [v for _, v in out.top[i]] == pytest.approx(top_v.tolist(), abs=1e-5)
    assert out.first_token_s is not None and 0 < out.first_token_s <= out.total_s


def test_a_kept_cache_serves_later_prompts_as_a_fresh_one_would(model):
    """The decoder keeps its cache (and on a GPU its graph) for the next prompt of the same length:
    what the longer first prompt left in the cache must not leak into the next."""
    decoder = GreedyDecoder(model, 2)
    other = list(range(200, 230))
    a, _ = _decode(decoder, PROMPT, 24)
    b, _ = _decode(decoder, other, 29)  # 30 + 29 == 35 + 24: the same cache length, reused
    c, _ = _decode(decoder, PROMPT[:10], 24)  # a shorter one: a new cache
    assert b.tokens == _reference(model, other, 29)[0]
    assert c.tokens == _reference(model, PROMPT[:10], 24)[0]
    assert _decode(decoder, PROMPT, 24)[0].tokens == a.tokens == _reference(model, PROMPT, 24)[0]


def test_a_stop_token_ends_the_stream_after_it_like_generates_eos(model):
    free = _reference(model, PROMPT, 30)[0]
    stop = free[6]
    ref = _reference(model, PROMPT, 30, eos=[stop])[0]
    out, _ = _decode(GreedyDecoder(model, 1), PROMPT, 30, stops=[stop])
    assert out.tokens == ref == free[: free.index(stop) + 1]
    assert out.stopped == "stop"


def test_should_stop_cancels_between_tokens(model):
    out, seen = _decode(GreedyDecoder(model, 1), PROMPT, 50, stop_after=5)
    assert out.stopped == "cancelled" and len(out.tokens) == len(seen) == 5
    assert len(out.chosen) == len(out.top) == 5


def test_sliding_window_caches_are_named_as_not_graphable():
    from transformers import Qwen2Config

    plain = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                        intermediate_size=128, vocab_size=256)
    sliding = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                          intermediate_size=128, vocab_size=256, use_sliding_window=True, sliding_window=16,
                          max_window_layers=0)
    assert graph_problem(plain) is None
    why = graph_problem(sliding)
    assert why is not None and "StaticSlidingWindowLayer" in why
