"""Decode-side reuse in the simulator (issue 30 item 3): a decode instance with a cache of
finished requests' hash_ids transfers only a follow-up's blocks past what it holds (as the
engine's delta KV transfer), and the router's ``cache_aware`` decode pick steers follow-ups to
the decode holding their history."""

from __future__ import annotations

from sglang_pd.scheduling.cost_model import PrefillCoeffs
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec, SimResult
from sglang_pd.sim.profiles import StepCost
from sglang_pd.sim.report import run_info
from sglang_pd.sim.workload import Arrival, Workload


def _cost() -> StepCost:
    """Prefill step 0.1 s + 1 ms per token, decode step 10 ms, 1000 bytes of KV per token."""
    return StepCost("toy", PrefillCoeffs(launch_s=0.1, b=0.001), lambda b, ctx, cmax: 0.01, 1000.0, 1_000_000)


def _run(spec: ClusterSpec, arrivals: list[Arrival]) -> SimResult:
    res = Cluster(spec, _cost()).run(Workload(arrivals))
    for inst in res.instances:  # every request ended and gave its pages back
        inst.sched.check_integrity()
        assert inst.sched.allocator.num_used == 0 and inst.in_flight == 0 and inst.transferring == 0
    assert all(t.finish is not None and not t.error for t in res.tracks)
    return res


TURNS = [Arrival(0.0, 1536, 2, (1, 2, 3)), Arrival(10.0, 2000, 2, (1, 2, 3, 4))]


def test_follow_up_transfers_only_the_blocks_past_what_decode_holds() -> None:
    slow = dict(num_prefill=1, num_decode=1, link_gb_s=0.001, link_latency_ms=0.0)  # 1 ms a token
    on = _run(ClusterSpec(**slow, decode_prefix_cache_tokens=100_000), TURNS)
    off = _run(ClusterSpec(**slow), TURNS)
    first, follow = on.tracks
    assert (first.reused_len, first.transfer_tokens) == (0, 1536)
    assert (follow.reused_len, follow.transfer_tokens) == (1536, 2000 - 1536)
    assert [t.transfer_tokens for t in off.tracks] == [1536, 2000] and off.tracks[1].reused_len == 0
    # the same prefill work; the follow-up's first token comes sooner by the bytes not sent
    assert on.tracks[1].prefill_done == off.tracks[1].prefill_done
    assert off.tracks[1].first_token - on.tracks[1].first_token > 1.0
    info = run_info(on, "x", None, {})
    assert (info["kv_transfer_tokens"], info["decode_reused_tokens"]) == (1536 + 464, 1536)


def test_the_block_with_the_last_token_always_travels() -> None:
    # the follow-up's prompt ends at a block boundary and equals what decode holds: the last
    # block is sent anyway (the first token rides with it)
    res = _run(ClusterSpec(num_prefill=1, num_decode=1, decode_prefix_cache_tokens=100_000),
               [Arrival(0.0, 1536, 2, (1, 2, 3)), Arrival(10.0, 1536, 2, (1, 2, 3))])
    assert res.tracks[1].reused_len == 1024 and res.tracks[1].transfer_tokens == 512


def _conversations(convs: int = 3, turns: int = 4) -> list[Arrival]:
    """Interleaved conversations, each turn resending the history (one more full block per
    turn) plus a new partial block: turn t holds t + 2 full blocks of history."""
    out = []
    for t in range(turns):
        for c in range(convs):
            ids = tuple(1000 * c + k for k in range(t + 2))
            out.append(Arrival(len(out) * 2.0, 512 * len(ids) + 100, 2, (*ids, 1000 * c + 500 + t)))
    return out


def test_cache_aware_decode_routing_reuses_what_round_robin_scatters() -> None:
    arrivals = _conversations()
    spec = dict(num_prefill=1, num_decode=2, decode_prefix_cache_tokens=1_000_000)
    rr = _run(ClusterSpec(**spec, router_decode="round_robin"), arrivals)
    ca = _run(ClusterSpec(**spec, router_decode="cache_aware"), arrivals)
    for t in ca.tracks[3:]:  # every follow-up finds the previous turn's full blocks
        assert t.reused_len == 512 * (len(t.hash_ids) - 2), (t.index, t.reused_len)
    # round robin: 3 conversations over 2 decodes, so a follow-up lands on the decode of the
    # turn before last (or on none): less reuse, more bytes over the link
    assert all(t.reused_len < 512 * (len(t.hash_ids) - 2) for t in rr.tracks[3:])
    assert sum(t.transfer_tokens for t in ca.tracks) < sum(t.transfer_tokens for t in rr.tracks)


def test_cache_aware_decode_routing_still_spreads_load() -> None:
    # the same conversations arriving 0.4 s apart with 80-token replies: several are held at
    # once, and a decode past the slack loses even its own conversations' follow-ups
    arrivals = [Arrival(a.arrival_s / 5, a.prompt_len, 80, a.hash_ids) for a in _conversations()]
    res = _run(ClusterSpec(num_prefill=1, num_decode=2, decode_prefix_cache_tokens=1_000_000,
                           router_decode="cache_aware"), arrivals)
    assert {t.d_inst for t in res.tracks} == {0, 1}
