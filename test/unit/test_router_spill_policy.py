"""``length_aware_spill`` (issue 34 item 0): a long prompt goes to an idle short-role prefill
instance when that is sooner than the long pool; shorts are routed as ``length_aware`` does,
and a busy short instance never takes one."""

from __future__ import annotations

from sglang_pd_router.policies import RouteRequest, RoutingConfig, WorkerView, create_routing_policy

CFG = RoutingConfig(short_prefill_threshold=256, default_prefill_tokens_per_s=1000.0)


def _pool(short_queued: int, long_queued: int) -> list[WorkerView]:
    return [WorkerView("http://s", "prefill", "short", queued_prefill_tokens=short_queued),
            WorkerView("http://l", "prefill", "long", queued_prefill_tokens=long_queued)]


def _pick(name: str, prompt: int, workers: list[WorkerView]) -> int | None:
    return create_routing_policy(name, CFG).select(RouteRequest(prompt), workers, 0.0)


def test_long_spills_to_an_idle_short_instance_when_the_long_pool_is_queued() -> None:
    workers = _pool(short_queued=0, long_queued=6000)
    assert _pick("length_aware", 3000, workers) == 1  # the static split: behind 6,000 tokens
    assert _pick("length_aware_spill", 3000, workers) == 0


def test_no_spill_when_the_long_pool_is_sooner_or_the_short_instance_is_busy() -> None:
    assert _pick("length_aware_spill", 3000, _pool(0, 0)) == 1  # equal: stay in the long pool
    assert _pick("length_aware_spill", 3000, _pool(300, 6000)) == 1  # shorts queued there
    workers = _pool(0, 6000)
    workers[0].healthy = False
    assert _pick("length_aware_spill", 3000, workers) == 1


def test_shorts_are_routed_as_length_aware_routes_them() -> None:
    for queued in ((0, 0), (0, 6000), (5000, 0)):
        workers = _pool(*queued)
        assert _pick("length_aware_spill", 100, workers) == _pick("length_aware", 100, workers) == 0


def test_a_decode_list_is_untouched() -> None:
    decodes = [WorkerView("http://d0", "decode", in_flight=3), WorkerView("http://d1", "decode")]
    assert _pick("length_aware_spill", 3000, decodes) == 1
