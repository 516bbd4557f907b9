"""parity-ui's own greedy loop over an HF model (decode=graphed), in this process on the CPU, against
transformers' generate(): float32, so tokens must be identical and logprobs equal to rounding.
On the CPU the loop runs without the CUDA graph; the graph itself is verified on the lent H100
(bench/hf_decode.py, figures in the notes)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from parity_ui.engines.hf_greedy import GreedyDecoder, graph_problem  # noqa: E402


PROMPT = list(range(5, 40))


@pytest.fixture(scope="module")
def model(build_tiny):
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = build_tiny("qwen2", seed=3)
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
    """The decoder keeps its cache (and on a GPU its graph) while the next prompt needs the same cache:
    what an earlier prompt left in it must not leak into the next."""
    decoder = GreedyDecoder(model, 2)
    other = list(range(200, 235))  # as long as PROMPT, other tokens: the same cache, reused
    a, _ = _decode(decoder, PROMPT, 24)
    kept = decoder._cache
    b, _ = _decode(decoder, other, 24)
    assert decoder._cache is kept
    assert b.tokens == _reference(model, other, 24)[0] != a.tokens
    c, _ = _decode(decoder, PROMPT[:10], 24)  # shorter: a cache of its own
    assert decoder._cache is not kept and c.tokens == _reference(model, PROMPT[:10], 24)[0]
    assert _decode(decoder, PROMPT, 24)[0].tokens == a.tokens == _reference(model, PROMPT, 24)[0]


def test_one_cache_sized_for_the_longest_prompt_serves_a_shorter_one(model):
    decoder = GreedyDecoder(model, 2)
    long_len = decoder.cache_len(len(PROMPT), 16)
    out = decoder.decode(PROMPT[:12], 16, set(), lambda i, t: None, lambda: False, cache_len=long_len)
    assert out.tokens == _reference(model, PROMPT[:12], 16)[0]


def test_one_token_and_a_first_token_that_stops(model):
    ref = _reference(model, PROMPT, 1)[0]
    one, _ = _decode(GreedyDecoder(model, 1), PROMPT, 1)
    assert one.tokens == ref and one.stopped == "length"
    stopped, seen = _decode(GreedyDecoder(model, 1), PROMPT, 20, stops=ref)
    assert stopped.tokens == ref and stopped.stopped == "stop" and seen == [(0, ref[0])]


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: run on the lent H100")
def test_on_a_gpu_graph_replay_equals_the_uncaptured_loop_across_reuse_and_changes(build_tiny):
    """The captured graph against the same loop run eagerly on the same GPU: the same kernels, so the
    same tokens and logprobs exactly, across a reused cache, a new max_new and a new top-k, with the
    float32 lm_head hook that fp32_logits adds."""
    from transformers import AutoModelForCausalLM

    from parity_ui.engines.hf_engine import _fp32_head

    path = build_tiny("llama", seed=5, dtype="bfloat16")
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to("cuda").eval()
    _fp32_head(m)
    graphed = GreedyDecoder(m, 3)
    eager = GreedyDecoder(m, 3)
    eager.use_graph = False
    for prompt, n in [(PROMPT, 40), (list(range(300, 335)), 40), (PROMPT, 17), (PROMPT[:9], 64)]:
        g, e = _decode(graphed, prompt, n)[0], _decode(eager, prompt, n)[0]
        assert graphed._graph is not None
        assert g.tokens == e.tokens and g.chosen == e.chosen and g.ranks == e.ranks and g.top == e.top
    g5 = GreedyDecoder(m, 5)
    assert _decode(g5, PROMPT, 20)[0].tokens == _decode(eager, PROMPT, 20)[0].tokens


def test_the_engine_refuses_graphed_for_what_a_graph_cannot_hold_before_loading():
    """HfEngine.check's part for decode=graphed: problems with a code and a fix, before any weights load."""
    from transformers import LlamaConfig, Qwen2Config

    from parity_ui.engines.hf_engine import HfEngine

    small = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                 intermediate_size=128, vocab_size=256)
    sliding = Qwen2Config(**small, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    dynamic = LlamaConfig(**small, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    vision = LlamaConfig(**small)
    vision.vision_config = {"depth": 1}
    cases = {"cuda": [sliding, dynamic, vision], "balanced": [LlamaConfig(**small)], "cpu": [vision]}
    for device, configs in cases.items():
        for config in configs:
            (p,) = HfEngine._graphed_problems(config, device)
            assert p.code == "graphed-unsupported" and "decode=static" in p.fix
    assert HfEngine._graphed_problems(sliding, "cpu") == []  # the uncaptured loop keeps Python state fine
    assert HfEngine._graphed_problems(LlamaConfig(**small), "cuda:0") == []
