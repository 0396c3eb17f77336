"""The migration splice (issue 35): a scripted decode leg dies after a byte of its stream
(every byte around each event's end, every 13th inside events, after the last token, with
[DONE] cut), and ``relay_with_migration`` must hand the client exactly the uninterrupted
stream: every token once, in order, the same text, counts and finish reason, one [DONE]; the
resumed body carries the prompt plus exactly the tokens the client already has, and the
max/min token budgets that remain. Stop token ids and max_new_tokens land at the splice too.
No sockets: legs are fake responses that yield 61-byte chunks (events span chunks), then fail
or end without [DONE]."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from sglang_pd_router.migrate import Resume, relay_with_migration

PROMPT = [11, 22, 33, 44, 55]
CHUNK = 61  # odd, smaller than an event: events span chunks


def _next_token(seq: list[int]) -> int:
    """A "greedy model": the next token is a function of the whole sequence before it."""
    return 3 + sum((i + 1) * t for i, t in enumerate(seq)) * 2654435761 % 97


def _leg(body: dict[str, Any]) -> bytes:
    """The SSE stream our decode server sends for ``body``: cumulative ids and text, one token
    per event, finish_reason on the last, then [DONE]."""
    ids, sp = list(body["input_ids"]), body.get("sampling_params") or {}
    n, stops, min_new = sp.get("max_new_tokens", 128), sp.get("stop_token_ids", []), \
        sp.get("min_new_tokens", 0)
    out: list[int] = []
    events = []
    while len(out) < n:
        out.append(_next_token(ids + out))
        finish = None
        if out[-1] in stops and len(out) >= min_new:
            finish = {"type": "stop", "matched": out[-1]}
        elif len(out) >= n:
            finish = {"type": "length", "length": len(out)}
        meta = {"prompt_tokens": len(ids), "completion_tokens": len(out), "finish_reason": finish,
                "output_token_logprobs": [[-0.5, t, None] for t in out]}
        events.append(b"data: " + orjson.dumps({"output_ids": list(out), "text": "".join(
            f"<{t}>" for t in out), "meta_info": meta}))
        if finish:
            break
    return b"\n\n".join([*events, b"data: [DONE]"]) + b"\n\n"


class _Content:
    def __init__(self, data: bytes, fail: bool) -> None:
        self.chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
        self.fail = fail

    async def readany(self) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        if self.fail:
            raise aiohttp.ClientPayloadError("connection lost")
        return b""


class _Resp:
    def __init__(self, data: bytes, fail: bool = False) -> None:
        self.content = _Content(data, fail)

    def close(self) -> None:
        pass


class _Out:
    def __init__(self) -> None:
        self.data = b""

    async def write(self, data: bytes) -> None:
        self.data += data


async def _relay(body: dict[str, Any], cut: int, fail: bool) -> tuple[list[bytes], list[dict]]:
    """Relay a first leg cut after ``cut`` bytes; every later leg is whole. Returns the client's
    events and the bodies of the resumed legs."""
    first_leg = _leg(body)[:cut]
    resp = _Resp(first_leg, fail)
    first = resp.content.chunks.pop(0) if resp.content.chunks else b""
    resumed: list[dict] = []

    async def reopen(new_body: dict[str, Any], _decode: Any):
        resumed.append(new_body)
        leg = _Resp(_leg(new_body))
        return leg, await leg.content.readany(), "second"

    async def alive(_decode: Any) -> bool:
        return False

    out = _Out()
    resume = Resume.for_request("/generate", body, True, 2)
    assert resume is not None
    await relay_with_migration(out, resp, first, "first", resume, reopen, alive, 1.0,  # type: ignore[arg-type]
                               lambda _d: None)
    events = [e for e in out.data.split(b"\n\n") if e]
    return events, resumed


def _check(body: dict[str, Any], events: list[bytes], resumed: list[dict]) -> None:
    want = [orjson.loads(e[5:]) for e in _leg(body).split(b"\n\n") if e and e != b"data: [DONE]"]
    assert events[-1] == b"data: [DONE]" and events.count(b"data: [DONE]") == 1
    got = [orjson.loads(e[5:]) for e in events[:-1]]
    assert got == want  # every event as the uninterrupted leg sent it: no gap, no duplicate
    for r in resumed:  # the prompt plus what the client had, and the budgets that remain
        k = len(r["input_ids"]) - len(PROMPT)
        assert r["input_ids"] == PROMPT + want[-1]["output_ids"][:k] and 0 <= k < len(want)
        sp, asked = r["sampling_params"], body["sampling_params"]
        assert sp["max_new_tokens"] == asked["max_new_tokens"] - k
        assert sp.get("min_new_tokens", 0) == max(0, asked.get("min_new_tokens", 0) - k)


CASES: dict[str, dict[str, Any]] = {
    "max_new_tokens": {"max_new_tokens": 6},
    "stop_token": {"max_new_tokens": 12, "stop_token_ids": None},  # filled below: 4th token
    "stop_token_before_min_new": {"max_new_tokens": 8, "min_new_tokens": 5,
                                  "stop_token_ids": None},  # the 2nd token, ignored until 5
}


def _body(case: str) -> dict[str, Any]:
    sp: dict[str, Any] = dict(CASES[case])
    if "stop_token_ids" in sp:  # a token of the unconstrained run: it ends the stream there
        free = orjson.loads(_leg({"input_ids": PROMPT, "sampling_params": {
            "max_new_tokens": 12}}).split(b"\n\n")[-3][5:])["output_ids"]
        sp["stop_token_ids"] = [free[1] if "min_new" in case else free[3]]
    return {"input_ids": PROMPT, "stream": True, "sampling_params": sp}


@pytest.mark.parametrize("fail", [True, False], ids=["connection_lost", "eof_without_done"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_leg_dying_after_any_byte_splices_into_the_uninterrupted_stream(case: str,
                                                                          fail: bool) -> None:
    body = _body(case)
    whole = _leg(body)
    assert (b'"stop"' in whole) == (case == "stop_token")
    done_at = whole.index(b"data: [DONE]")
    # the last token event was whole: nothing left to generate, so no new leg
    last_event_end = whole.rindex(b"\n\n", 0, done_at) + 2

    async def every_cut() -> None:
        # every byte around each event's end ("\n\n" split or whole) and every 13th inside
        ends = [i + 2 for i in range(len(whole)) if whole.startswith(b"\n\n", i)]
        cuts = {c for e in ends for c in range(e - 3, e + 2)} | set(range(0, len(whole), 13))
        for cut in sorted(c for c in cuts if 0 <= c < len(whole)):
            events, resumed = await _relay(body, cut, fail)
            _check(body, events, resumed)
            assert (resumed == []) == (cut >= last_event_end), cut

    asyncio.run(every_cut())


def test_stop_strings_are_not_migrated() -> None:
    """A stop string can span the splice (its start streamed by the dead leg, its end made by
    the new one, which never sees it in its output), and the server holds back the text of a
    possible stop's prefix while its tokens are already streamed: the resumed text would have
    a gap. Such a stream ends with an error event instead of a wrong answer."""
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "stop": ["ab"]}}
    assert Resume.for_request("/generate", body, True, 2) is None
    assert Resume.for_request("/generate", {**body, "sampling_params": {"stop": []}}, True,
                              2) is not None
