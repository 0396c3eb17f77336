"""Conditional disaggregation (issue 34 item 3): the pure decision (policies/conditional.py) and
the router's use of it over fake workers: a short prompt whose prefill is loaded goes to decode
alone, with the local bootstrap host and no prefill leg; everything else takes the PD path."""

from __future__ import annotations

import orjson
import pytest

from router_helpers import router_cluster
from sglang_pd_router.policies import RouteRequest, RoutingConfig, WorkerView
from sglang_pd_router.policies.conditional import (LOCAL_PREFILL_HOST, ConditionalConfig,
                                                   prefill_on_decode)

ROUTING = RoutingConfig(short_prefill_threshold=256)
CFG = ConditionalConfig(min_prefill_queue_tokens=512, max_decode_queue_tokens=512)


def _decide(prompt: int, prefill_queued: int, decode_queued: int = 0,
            cfg: ConditionalConfig = CFG, cached: int = 0) -> bool:
    return prefill_on_decode(RouteRequest(prompt, cached),
                             WorkerView("http://p", "prefill", queued_prefill_tokens=prefill_queued),
                             WorkerView("http://d", "decode", queued_prefill_tokens=decode_queued),
                             cfg, ROUTING)


def test_a_short_prompt_is_prefilled_on_decode_only_when_its_prefill_is_loaded() -> None:
    assert _decide(100, prefill_queued=4000)
    assert not _decide(100, prefill_queued=0)  # idle prefill: the PD path is as fast
    assert not _decide(100, prefill_queued=511)  # below the "loaded" bound


def test_long_prompts_and_a_busy_decode_worker_keep_the_prefill_leg() -> None:
    assert not _decide(257, prefill_queued=100_000)  # longer than the short threshold
    assert _decide(400, prefill_queued=4000, cached=200)  # new tokens count, not the prompt
    assert not _decide(100, prefill_queued=4000, decode_queued=450)  # 450 + 100 > 512
    assert _decide(100, prefill_queued=600, decode_queued=400, cfg=ConditionalConfig(
        max_decode_queue_tokens=10_000))
    assert not _decide(100, prefill_queued=600, decode_queued=600, cfg=ConditionalConfig(
        min_prefill_queue_tokens=100, max_decode_queue_tokens=10_000))  # decode as queued
    by_length = ConditionalConfig(min_prefill_queue_tokens=0)  # llm-d's decider: length alone
    assert _decide(100, prefill_queued=0, cfg=by_length)
    assert not _decide(300, prefill_queued=9000, cfg=by_length)
    assert not _decide(100, prefill_queued=0, decode_queued=500, cfg=by_length)
    sick = WorkerView("http://d", "decode", healthy=False)
    assert not prefill_on_decode(RouteRequest(10), WorkerView("http://p", "prefill",
                                 queued_prefill_tokens=9000), sick, CFG, ROUTING)


def test_max_local_tokens_overrides_the_short_threshold_and_bad_settings_are_refused() -> None:
    assert _decide(64, 4000, cfg=ConditionalConfig(max_local_tokens=64))
    assert not _decide(65, 4000, cfg=ConditionalConfig(max_local_tokens=64))
    for bad in ({"max_local_tokens": -1}, {"min_prefill_queue_tokens": 1.5},
                {"max_decode_queue_tokens": True}):
        with pytest.raises(ValueError, match="conditional disaggregation"):
            ConditionalConfig(**bad)  # type: ignore[arg-type]


def test_the_local_host_is_the_servers_fake_bootstrap_host() -> None:
    from sglang_pd.protocol import FAKE_BOOTSTRAP_HOST

    assert LOCAL_PREFILL_HOST == FAKE_BOOTSTRAP_HOST  # the server runs such requests itself


async def _send(c, prompt_words: int) -> dict:
    body = {"text": " ".join(["w"] * prompt_words), "sampling_params": {"max_new_tokens": 3}}
    async with c.client.post(c.url + "/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return orjson.loads(await resp.read())


async def test_the_router_sends_a_short_prompt_to_decode_alone_when_the_prefill_is_loaded() -> None:
    async with router_cluster(conditional=ConditionalConfig(min_prefill_queue_tokens=512)) as c:
        (prefill,), (decode,) = c.prefills, c.decodes
        worker = c.service.registry.by_kind["prefill"][0]
        worker.polled["num_queue_prefill_tokens"] = 0  # idle: the PD path
        await _send(c, 8)
        assert prefill.received == 1 and decode.bodies[-1]["bootstrap_host"] != LOCAL_PREFILL_HOST
        worker.polled["num_queue_prefill_tokens"] = 5000  # loaded: decode prefills it
        await _send(c, 8)
        assert prefill.received == 1, "a local prefill must send nothing to the prefill worker"
        assert decode.bodies[-1]["bootstrap_host"] == LOCAL_PREFILL_HOST
        assert "bootstrap_room" in decode.bodies[-1]
        await _send(c, 2000)  # a long prompt keeps its prefill leg, loaded or not
        assert prefill.received == 2
        assert c.service.registry.by_kind["decode"][0].outstanding_prefill_tokens == 0
        metrics = c.service.metrics.render().decode()
        assert 'prefill="local"' in metrics and 'request_class="short"' in metrics


async def test_off_by_default_every_request_takes_its_prefill_leg() -> None:
    async with router_cluster() as c:
        c.service.registry.by_kind["prefill"][0].polled["num_queue_prefill_tokens"] = 5000
        await _send(c, 8)
        assert c.prefills[0].received == 1
        assert c.decodes[0].bodies[-1]["bootstrap_host"] != LOCAL_PREFILL_HOST
