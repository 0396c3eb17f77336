"""Rank 0's plan send never blocks the engine loop on a dead rank (engine/tp/launcher.py).

Found by running the PD+TP decode-rank kill test alone: the first forward after the kill
failed, but the next step's plan went to a PUSH socket whose only peer was gone, and the send
blocked the loop for good, so the server never noticed the dead rank and never exited."""

from __future__ import annotations

import time

import pytest
import zmq

from sglang_pd.engine.tp.group import TPGroup
from sglang_pd.engine.tp.launcher import TPRanks
from sglang_pd.engine.tp.messages import StepPlan
from sglang_pd.server_args import ServerArgs


class _Proc:
    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


def _plan() -> StepPlan:
    return StepPlan("decode", [1], [0], [0], [1], [1], [[0]])


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()


def _ranks(ctx: zmq.Context, returncode: int | None, send_timeout_ms: int) -> TPRanks:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDTIMEO, send_timeout_ms)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("inproc://plans")  # no rank ever connects: a peer that is gone
    ready = ctx.socket(zmq.PULL)
    ready.setsockopt(zmq.LINGER, 0)
    return TPRanks(ServerArgs(model_path="unused"), TPGroup.single(), {1: _Proc(returncode)},
                   ctx, [sock], ready)


def _close(ranks: TPRanks) -> None:
    for sock in (*ranks.plan_socks, ranks.ready_sock):
        sock.close(linger=0)


def test_a_dead_rank_fails_the_send_at_once(ctx) -> None:
    ranks = _ranks(ctx, returncode=-9, send_timeout_ms=60_000)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 died"):
        ranks.send(_plan())
    assert time.monotonic() - t0 < 5  # not the socket's 60 s timeout: the check comes first
    assert ranks.stats.plans == 0
    _close(ranks)


def test_a_rank_that_takes_no_plan_fails_the_send_and_breaks_the_group(ctx) -> None:
    ranks = _ranks(ctx, returncode=None, send_timeout_ms=200)
    with pytest.raises(RuntimeError, match="took no step plan"):
        ranks.send(_plan())
    assert ranks.broken and ranks.failure() is not None  # the engine loop then exits
    _close(ranks)
