"""Request migration on a real PD cluster (issue 35 bar): 32 concurrent streamed greedy
requests on a 1-prefill, 2-decode cluster; one decode is SIGKILLed mid-stream. Every stream
completes, each equal token for token to the colocated server's answer up to the first
position where the reference's top-2 logits are a float32 near-tie (below).

Why the near-tie cut: a migrated request is re-prefilled with prompt + streamed tokens in one
extend (other kernel shapes and batch mates than the uninterrupted decode steps), so its logits
differ from the reference's by float32 noise (a few 1e-5 on the tiny model, logits std ~13).
Where the reference's top-2 margin is smaller than that, either token is a correct greedy
answer. Stream 26 has such a tie at token 35 (margin 1.1e-5 between 3604 and 1603; resumed
after 2 or 4 tokens our model picks 1603): it failed 1 of 3 CI runs before this cut."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from pd_utils import async_client, kill_server, routed_cluster

pytestmark = pytest.mark.timeout(400)

N = 32
# Top-2 logit margins below this are float32 near-ties: the re-prefill path may flip them.
# (Measured path noise on the tiny model is <= 6e-5; the next-closest margin of these bodies
# is 8.8e-4, at the last token of stream 12.)
TIE_MARGIN = 1e-3
SAMPLING = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
BODIES = [{"input_ids": [3 + (j * (37 + i)) % 900 for j in range(24 + i)],
           "sampling_params": SAMPLING} for i in range(N)]


@pytest.fixture
def cluster(tiny_model_dir, tmp_path):
    flags = ("--decode-policy", "round_robin", "--pool-controller", "off",
             "--health-check-interval-secs", "0.5", "--health-failure-threshold", "1",
             "--max-migrations", "2", "--request-timeout-secs", "120")
    with routed_cluster(tiny_model_dir, tmp_path, [()], 2, flags) as c:
        yield c


async def _stream(client: httpx.AsyncClient, url: str, body: dict, seen: list[int], i: int
                  ) -> tuple[str, object]:
    last = None
    ids_seen: list[list[int]] = []
    async with client.stream("POST", url, json={**body, "stream": True}) as resp:
        if resp.status_code != 200:
            return "error", (await resp.aread()).decode()
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                return "error", event["error"]["message"]
            last = event
            ids_seen.append(event["output_ids"])
            seen[i] = len(event["output_ids"])
    # cumulative ids only ever grow by appending: no gap, no duplicate
    assert all(a == b[:len(a)] for a, b in zip(ids_seen, ids_seen[1:]))
    return "ok", last["output_ids"] if last else None


def _reference(url: str, body: dict) -> tuple[list[int], int]:
    """The colocated greedy tokens and how many of them are free of near-ties (the first
    position whose top-2 margin is below TIE_MARGIN; all of them when none is)."""
    meta_body = {**body, "return_logprob": True, "top_logprobs_num": 2}
    out = httpx.post(url + "/generate", json=meta_body, timeout=60).json()
    tops = out["meta_info"]["output_top_logprobs"]
    assert len(tops) == len(out["output_ids"]) and all(len(top) == 2 for top in tops)
    exact = next((t for t, top in enumerate(tops) if top[0][0] - top[1][0] < TIE_MARGIN),
                 len(tops))
    return out["output_ids"], exact


def test_sigkilled_decode_mid_stream_every_stream_completes_equal_to_colocated(
        cluster, colocated_server) -> None:
    router, _prefills, (victim, _survivor) = cluster
    refs = [_reference(colocated_server.base_url, b) for b in BODIES]
    # the claim stays about nearly every stream: the tiny model's logits are spread wide (two
    # of these 32 have a margin under TIE_MARGIN: stream 26 at token 35, stream 12 at its last)
    whole = sum(exact == SAMPLING["max_new_tokens"] for _, exact in refs)
    assert whole >= N - 3, [(i, exact) for i, (_, exact) in enumerate(refs)]

    async def run():
        seen = [0] * N
        async with async_client(timeout=180) as client:
            tasks = [asyncio.ensure_future(_stream(client, router.base_url + "/generate", b,
                                                   seen, i)) for i, b in enumerate(BODIES)]
            deadline = time.monotonic() + 60
            while sum(1 for s in seen if s >= 2) < N // 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            mid = sum(1 for s in seen if 0 < s < SAMPLING["max_new_tokens"])
            await asyncio.to_thread(kill_server, victim)
            return await asyncio.gather(*tasks), mid

    results, mid = asyncio.run(run())
    print(f"streams mid-way at the kill: {mid}; outcomes: "
          f"{sum(k == 'ok' for k, _ in results)} ok of {N}; compared whole: {whole}, up to a "
          f"near-tie: {[(i, e) for i, (_, e) in enumerate(refs) if e < len(refs[i][0])]}")
    assert mid > 0  # the kill landed mid-stream
    log = router.log()
    splices = [line for line in log.splitlines() if "migrating" in line]
    for i, (kind, value) in enumerate(results):
        assert kind == "ok", (i, value)
        want, exact = refs[i]
        assert isinstance(value, list) and len(value) == len(want), (i, value)
        first_diff = next((t for t, (a, b) in enumerate(zip(value, want)) if a != b), None)
        assert first_diff is None or first_diff >= exact, (
            f"stream {i} differs at token {first_diff} (near-ties from {exact}): "
            f"got {value[first_diff:first_diff + 3]}, want {want[first_diff:first_diff + 3]}; "
            f"splices: {splices}")
    parted = [i for i, (_, value) in enumerate(results) if value != refs[i][0]]
    print(f"streams that parted from the reference at their near-tie: {parted}")
    assert splices
