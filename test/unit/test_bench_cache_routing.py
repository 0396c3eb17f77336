"""scripts/bench_cache_routing.py's multi-turn workload (the cluster run itself is a benchmark,
not a test): every turn resends the whole history, so a turn's prompt extends the one before;
conversations share only the system prompt; the same arguments give the same ids (both runs
of the benchmark send the same workload)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_cache_routing as bcr  # noqa: E402


def _args(**kw: int) -> argparse.Namespace:
    base = dict(seed=1, conversations=3, turns=4, system_tokens=32, first_user_min=64, first_user_max=192,
                user_min=48, user_max=160, max_new_tokens=8, vocab=bcr.VOCAB)
    base.update(kw)
    return argparse.Namespace(**base)


def test_turns_extend_the_history_and_conversations_share_the_system_prompt() -> None:
    convs = bcr.build_conversations(_args())
    assert len(convs) == 3 and all(len(c) == 4 for c in convs)
    for turns in convs:
        assert 32 + 64 <= len(turns[0]) <= 32 + 192
        for prev, cur in zip(turns, turns[1:]):
            # the previous prompt, its 8-token reply, then 48..160 new user tokens
            assert cur[: len(prev)] == prev and 8 + 48 <= len(cur) - len(prev) <= 8 + 160
    a, b = convs[0][0], convs[1][0]
    assert a[:32] == b[:32] and a[32:40] != b[32:40]
    assert bcr.build_conversations(_args()) == convs
    assert bcr.build_conversations(_args(seed=2)) != convs
