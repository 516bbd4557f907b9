"""The scored chunk's scoring in pieces on a thread (parity_ui.commands.workload.pieces): the parts in
order with every call's answer, the calls made ahead of the caller on ONE other thread and in order,
an engine's failure raised at its part, the calls not started dropped when the caller stops early,
and inline on the caller's thread for a cluster block."""
from __future__ import annotations

import threading
import time

import pytest

from parity_ui.commands.workload.pieces import pieces, scored_in_pieces


def test_pieces_split_a_per_item_scorer_and_keep_one_call_for_a_batching_one():
    assert pieces(70, per_item=True, piece=32) == [range(0, 32), range(32, 64), range(64, 70)]
    assert pieces(70, per_item=False, piece=32) == [range(0, 70)]
    assert pieces(0, per_item=True) == [] and pieces(0, per_item=False) == []


def test_calls_run_ahead_in_order_on_one_thread_and_answers_come_back_by_part():
    seen: list[tuple[str, int, int]] = []
    caller = threading.get_ident()

    def call(name):
        def run(part):
            seen.append((name, part.start, threading.get_ident()))
            return [f"{name}{x}" for x in part]
        return run

    parts = pieces(10, per_item=True, piece=4)
    out = []
    for part, got in scored_in_pieces([call("ref"), call("floor")], parts):
        if not out:
            time.sleep(0.2)  # the caller is slow on the first part: the thread goes on meanwhile
            assert len(seen) == 6, "the later parts were scored while the caller worked on the first"
        out.append((part, got))
    assert [p for p, _ in out] == parts
    assert out[1][1] == [["ref4", "ref5", "ref6", "ref7"], ["floor4", "floor5", "floor6", "floor7"]]
    assert [(n, s) for n, s, _ in seen] == [("ref", 0), ("floor", 0), ("ref", 4), ("floor", 4), ("ref", 8), ("floor", 8)]
    assert len({t for _, _, t in seen}) == 1 and seen[0][2] != caller


def test_a_failing_call_is_raised_at_its_part_and_later_calls_are_dropped():
    made: list[int] = []
    release = threading.Event()

    def call(part):
        if part.start == 2:
            raise RuntimeError("the engine failed")
        if part.start >= 4:
            release.wait(2)
        made.append(part.start)
        return list(part)

    got = []
    with pytest.raises(RuntimeError, match="the engine failed"):
        for part, answers in scored_in_pieces([call], pieces(12, per_item=True, piece=2)):
            got.append(answers[0])
            release.set()
    assert got == [[0, 1]] and made == [0]  # after the failure no later call reached the engine


def test_leaving_early_cancels_what_has_not_started_and_inline_runs_on_the_caller():
    made: list[int] = []

    def slow(part):
        time.sleep(0.05)
        made.append(part.start)
        return part.start

    gen = scored_in_pieces([slow], pieces(40, per_item=True, piece=1))
    assert next(gen) == (range(0, 1), [0])
    gen.close()  # the caller stopped (a Stop, an error in its own work)
    assert len(made) <= 3
    caller = threading.get_ident()
    where = []
    got = list(scored_in_pieces([lambda p: where.append(threading.get_ident()) or p.start], pieces(3, True, 1),
                                threaded=False))
    assert [a for _, (a,) in got] == [0, 1, 2] and set(where) == {caller}
