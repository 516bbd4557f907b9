"""How HF scoring packs rows into forwards (parity_ui.engines.hf_score.pack): pure, no engine."""
from __future__ import annotations

from parity_ui.engines.hf_score import pack, token_budget


def test_pack_fills_forwards_by_length_within_the_budget():
    lengths = [10, 30, 10, 20, 30, 5]
    assert pack(lengths, 60, same_length=False) == [[1, 4], [3, 0, 2], [5]]
    assert pack(lengths, 60, same_length=True) == [[1, 4], [3], [0, 2], [5]]
    assert pack([100, 3], 50, same_length=False) == [[0], [1]]  # a row over the budget goes alone


def test_the_token_budget_is_the_sides_or_the_devices_within_the_logits_cap():
    assert token_budget(123, "cpu", 49152, 4) == 123
    assert token_budget(None, "cpu", 49152, 4) == 4096
    assert token_budget(None, "cuda:0", 49152, 2) == 8192
    assert token_budget(None, "cuda:0", 262144, 4) == 2048  # a large vocabulary: 2 GiB of logits at most


def test_cleaned_is_clean_logprob_over_the_row_also_where_a_value_is_not_finite():
    """hf_score._cleaned skips the call per value only where every value is finite: the same list as
    clean_logprob over it, -inf (a masked token) and NaN made -1e30, the largest finite float32s kept."""
    import math

    from parity_ui.engines.base import clean_logprob
    from parity_ui.engines.hf_score import _cleaned

    big = 3.4028234663852886e38  # float32's largest: 1,000 of them do not overflow the float64 sum
    for row in ([-0.5, -2.25, -big] * 1000, [-0.5, -math.inf, -1.0], [math.nan, -1.0], [math.inf, -math.inf],
                [-big, big, math.nan], [], [0.0, -0.0]):
        got, want = _cleaned(list(row)), list(map(clean_logprob, row))
        assert [x.hex() for x in got] == [x.hex() for x in want], row
