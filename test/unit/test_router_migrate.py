"""Request migration (issue 35): a decode that breaks off or hangs mid-stream is replaced by
another pair fed the prompt plus the streamed tokens; the client's stream continues without a
gap or a duplicate and equals an uninterrupted run ("greedy" fake workers)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from router_helpers import router_cluster
from sglang_pd_router.fake_worker import FakeBehaviour
from sglang_pd_router.migrate import Resume

pytestmark = pytest.mark.timeout(60)
PROMPT = [11, 22, 33, 44]
BODY = {"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 12}}


async def _stream(c, body=BODY) -> list[dict]:
    async with c.client.post(c.url + "/generate", json=body) as r:
        assert r.status == 200
        text = (await r.read()).decode()
    events = [line[5:].strip() for line in text.split("\n") if line.startswith("data:")]
    assert events[-1] == "[DONE]" or "error" in events[-1], events[-3:]
    return [orjson.loads(e) for e in events if e != "[DONE]"]


async def _reference() -> list[dict]:
    async with router_cluster() as c:
        c.decodes[0].behaviour = FakeBehaviour(deterministic=True)
        return await _stream(c)


@pytest.mark.parametrize("fault", ["break_after", "hang_after"])
async def test_stream_continues_on_another_decode_equal_to_an_uninterrupted_run(fault) -> None:
    want = await _reference()
    async with router_cluster(n_decode=2, decode_policy="round_robin", first_byte_timeout_s=0.3,
                              health_check_timeout_s=0.3) as c:
        first, second = c.decodes
        first.behaviour = FakeBehaviour(deterministic=True, **{fault: 5})
        second.behaviour = FakeBehaviour(deterministic=True)
        got = await _stream(c)
        assert [e["output_ids"] for e in got] == [e["output_ids"] for e in want]
        assert got[-1]["text"] == want[-1]["text"]
        assert got[-1]["meta_info"]["completion_tokens"] == 12
        assert got[-1]["meta_info"]["prompt_tokens"] == len(PROMPT)
        resumed = second.bodies[0]
        assert resumed["input_ids"] == PROMPT + want[4]["output_ids"]
        assert resumed["sampling_params"]["max_new_tokens"] == 7
        assert c.prefills[0].bodies[1]["input_ids"] == resumed["input_ids"]  # a new prefill
        assert c.service.registry.find(first.url).breaker.failures == 1


async def test_migration_limit_and_off_switch_end_the_stream_with_an_error() -> None:
    for cfg in ({"max_migrations": 0}, {"max_migrations": 1}):
        async with router_cluster(n_decode=2, decode_policy="round_robin", **cfg) as c:
            for d in c.decodes:  # every decode breaks off: the limit ends it
                d.behaviour = FakeBehaviour(deterministic=True, break_after=3)
            got = await _stream(c)
            assert "error" in got[-1]
            ids = [e["output_ids"] for e in got if "output_ids" in e]
            assert all(a == b[:len(a)] for a, b in zip(ids, ids[1:]))  # no gap, no duplicate
            assert len(c.decodes[0].bodies) + len(c.decodes[1].bodies) == 1 + cfg["max_migrations"]


async def test_text_prompts_and_unstreamed_requests_are_not_migrated() -> None:
    assert Resume.for_request("/generate", {"text": "hi"}, True, 2) is None
    assert Resume.for_request("/generate", BODY, False, 2) is None
    assert Resume.for_request("/v1/completions", {"prompt": [1]}, True, 2) is None
    assert Resume.for_request("/generate", BODY, True, 0) is None
    assert Resume.for_request("/generate", BODY, True, 2) is not None


async def test_a_break_after_the_last_token_just_ends_the_stream() -> None:
    async with router_cluster(n_decode=2, decode_policy="round_robin") as c:
        c.decodes[0].behaviour = FakeBehaviour(deterministic=True, break_after=12)
        got = await _stream(c)
        assert got[-1]["meta_info"]["finish_reason"] and len(got) == 12
        assert c.decodes[1].bodies == []
    await asyncio.sleep(0)
