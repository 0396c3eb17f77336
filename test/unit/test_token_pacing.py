"""--token-pacing's pacer on a fake clock: tokens ahead of the TPOT pace are held, none late."""

from __future__ import annotations

import pytest

from sglang_pd.frontend.token_pacing import TokenPacer, split_output
from sglang_pd.protocol import ReqOutput, TokenLogprob


class FakeLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, object]] = []

    def call_later(self, delay: float, fn) -> object:
        self.timers.append((self.now + delay, fn))
        return fn

    def run_until(self, t: float) -> None:
        while True:
            due = sorted((d, i) for i, (d, _) in enumerate(self.timers) if d <= t)
            if not due:
                self.now = t
                return
            d, i = due[0]
            self.now = d
            _, fn = self.timers.pop(i)
            fn()


def out(tokens: list[int], done: int, finish: dict | None = None, status: int = 0) -> ReqOutput:
    return ReqOutput("r", tokens, 5, done, finish_reason=finish, error_status=status)


def make(T: float = 0.05):
    loop, got = FakeLoop(), []
    pacer = TokenPacer(T, lambda o: got.append((loop.now, o)), clock=lambda: loop.now,
                       call_later=loop.call_later)
    return loop, got, pacer


def test_a_burst_is_released_at_the_tpot_pace() -> None:
    loop, got, pacer = make()
    pacer.push(out([1], 1))  # first token: at once
    loop.now = 0.01
    pacer.push(out([2, 3, 4], 4, finish={"type": "length", "length": 4}))  # a burst, 3 ahead
    assert [o.new_token_ids for _, o in got] == [[1]]
    loop.run_until(1.0)
    assert [(round(t, 6), o.new_token_ids, o.completion_tokens) for t, o in got] == [
        (0.0, [1], 1), (0.05, [2], 2), (0.1, [3], 3), (0.15, [4], 4)]
    assert got[-1][1].finish_reason == {"type": "length", "length": 4}
    assert all(o.finish_reason is None for _, o in got[:-1])


def test_tokens_behind_the_pace_are_never_held() -> None:
    loop, got, pacer = make()
    pacer.push(out([1], 1))
    for k, t in enumerate([0.07, 0.2, 0.26], start=2):  # every token later than its pace slot
        loop.run_until(t)
        pacer.push(out([k], k))
        assert got[-1] == (t, got[-1][1]) and got[-1][1].new_token_ids == [k]
    assert pacer.held == 0


def test_errors_and_aborts_flush_at_once() -> None:
    loop, got, pacer = make()
    pacer.push(out([1, 2, 3], 3))
    pacer.push(out([], 3, finish={"type": "abort", "message": "x"}, status=500))
    assert [o.new_token_ids for _, o in got] == [[1], [2], [3], []] and loop.now == 0.0


def test_close_drops_held_tokens() -> None:
    loop, got, pacer = make()
    pacer.push(out([1, 2, 3], 3))
    pacer.close()
    loop.run_until(1.0)
    assert len(got) == 1 and pacer.held == 0


def test_split_keeps_logprobs_per_token() -> None:
    o = out([7, 8], 2, finish={"type": "stop", "matched": 8})
    o.output_token_logprobs = [TokenLogprob(-0.1, 7), TokenLogprob(-0.2, 8)]
    a, b = split_output(o)
    assert a.output_token_logprobs == [TokenLogprob(-0.1, 7)] and b.output_token_logprobs == [TokenLogprob(-0.2, 8)]
    assert a.finish_reason is None and b.finish_reason == {"type": "stop", "matched": 8}


def test_needs_a_positive_tpot() -> None:
    with pytest.raises(ValueError, match="TPOT"):
        TokenPacer(0.0, lambda o: None)
