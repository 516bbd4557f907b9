"""The shared-seed noise (parity_ui.engines.shared_seed): a pure function of (seed, prompt, position,
token), bit-identical between the tensor hash and the plain-integer one, Gumbel distributed, and a
draw that keeps the configured set."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from parity_ui.core.config import build_config  # noqa: E402
from parity_ui.core.errors import ConfigError  # noqa: E402
from parity_ui.core import mapping  # noqa: E402
from parity_ui.engines import shared_seed as ss  # noqa: E402


def test_the_tensor_hash_is_the_integer_hash_bit_for_bit():
    xs = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xDEADBEEF, 123456789]
    got = ss.mix32_t(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [ss.mix32(x) for x in xs]
    assert all(0 <= v <= ss.M32 for v in got)


def test_noise_is_a_pure_function_of_seed_prompt_position_and_token():
    key = ss.prompt_key([1, 2, 3])
    a = ss.uniforms(7, [(key, 0), (key, 1)], 4096)
    b = ss.uniforms(7, [(key, 0), (key, 1)], 4096)
    assert torch.equal(a, b)  # the same inputs, the same bits
    assert not torch.equal(a[0], a[1])  # another position, other noise
    assert not torch.equal(a, ss.uniforms(8, [(key, 0), (key, 1)], 4096))  # another seed
    assert not torch.equal(a[0], ss.uniforms(7, [(ss.prompt_key([1, 2, 4]), 0)], 4096)[0])  # another prompt
    # A row does not depend on the rows drawn with it, nor on the vocabulary's size past its ids.
    assert torch.equal(ss.uniforms(7, [(key, 1)], 100)[0], a[1, :100])
    # The key is the prompt's ids, not its object: equal ids, equal key.
    assert ss.prompt_key([1, 2, 3]) == key != ss.prompt_key([3, 2, 1])


def test_noise_is_roughly_standard_gumbel():
    g = ss.gumbel(1, [(ss.prompt_key([5]), p) for p in range(50)], 4000).flatten()
    u = ss.uniforms(1, [(ss.prompt_key([5]), p) for p in range(50)], 4000).flatten()
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    assert g.mean().item() == pytest.approx(0.5772, abs=0.01)  # Euler-Mascheroni
    assert g.var().item() == pytest.approx(math.pi ** 2 / 6, abs=0.03)
    # The CDF exp(-exp(-x)) at a few points.
    for x in (-1.0, 0.0, 1.0, 3.0):
        assert (g <= x).double().mean().item() == pytest.approx(math.exp(-math.exp(-x)), abs=0.005)
    # Neighbouring token ids and positions are not correlated.
    rows = ss.uniforms(1, [(7, 0), (7, 1)], 20000)
    assert abs(torch.corrcoef(rows)[0, 1].item()) < 0.03
    assert abs(torch.corrcoef(torch.stack([rows[0, :-1], rows[0, 1:]]))[0, 1].item()) < 0.03


def test_gumbel_max_samples_the_distribution():
    """argmax(logits + g) over many keys picks each token at its softmax probability."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    s = ss.Settings(seed=3, temperature=1.0)
    chosen, _ = ss.draw(logits, s, [(11, p) for p in range(20000)])
    freq = torch.bincount(chosen, minlength=4).double() / 20000
    assert torch.allclose(freq, torch.softmax(logits[0].double(), -1), atol=0.012)


def test_the_draw_keeps_min_p_top_k_top_p_and_records_what_it_kept():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]))
    keys = [(1, 0)]
    _, (d,) = ss.draw(logits, ss.Settings(0, 1.0, top_p=0.8), keys)
    assert d.kept == 2 and d.kept_mass == pytest.approx(0.8) and d.token_id in (0, 1)
    assert d.processed_logprob == pytest.approx(math.log([0.5, 0.3][d.token_id] / 0.8))
    _, (d,) = ss.draw(logits, ss.Settings(0, 1.0, top_k=3), keys)
    assert d.kept == 3 and d.kept_mass == pytest.approx(0.9)
    _, (d,) = ss.draw(logits, ss.Settings(0, 1.0, min_p=0.15), keys)  # p >= 0.075
    assert d.kept == 3
    _, (d,) = ss.draw(logits, ss.Settings(0, 1.0, top_k=1), keys)
    assert d.kept == 1 and d.token_id == 0 and d.margin == ss.NO_RUNNER_UP
    # The margin is the perturbed top-2 gap.
    chosen, (d,) = ss.draw(logits, ss.Settings(5, 1.0), keys)
    pert = (logits.double() + ss.gumbel(5, keys, 5))[0]
    top = torch.topk(pert, 2).values
    assert chosen.item() == int(pert.argmax()) and d.margin == pytest.approx((top[0] - top[1]).item())
    with pytest.raises(ValueError, match="greedy"):
        ss.draw(logits, ss.Settings(0, 0.0), keys)


def test_force_leaves_only_the_drawn_token():
    x = torch.randn(3, 10)
    before = x.clone()
    out = ss.force(x, torch.tensor([4, 0, 9]))
    assert out.argmax(-1).tolist() == [4, 0, 9] and torch.isinf(out).sum() == 27
    assert torch.equal(x, before)  # HF keeps the tensor it handed the processor as its raw logits


def test_the_mapping_names_the_engines_processor_and_its_settings():
    assert mapping.SHARED_SEED_EXTRA_ARGS == ss.EXTRA_ARGS_KEY
    module, _, cls = mapping.SHARED_SEED_PROCESSOR.partition(":")
    assert module == "parity_ui.engines.vllm_shared_seed" and cls == "SharedSeedLogitsProcessor"
    cfg = build_config(None, ["sampling=shared-seed", "temperature=1", "top_p=0.8", "top_k=0"])
    assert cfg.shared_seed and mapping.shared_seed_settings(cfg) == \
        {"seed": 0, "temperature": 1.0, "top_p": 0.8, "top_k": 0, "min_p": 0.0}
    # temperature 0 in shared-seed mode is greedy: nothing is drawn.
    assert not build_config(None, ["sampling=shared-seed", "temperature=0"]).shared_seed


def test_settings_shared_seed_cannot_honour_are_refused_by_name():
    with pytest.raises(ConfigError, match="repetition_penalty"):
        build_config(None, ["sampling=shared-seed", "temperature=1", "repetition_penalty=1.1"])
    with pytest.raises(ConfigError, match="logprobs_mode"):
        build_config(None, ["sampling=shared-seed", "temperature=1", "logprobs_mode=processed_logprobs"])
    with pytest.raises(ConfigError, match="sampling"):
        build_config(None, ["sampling=gumbel"])
