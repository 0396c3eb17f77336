"""Our router (issue 17, bar 1): router + a short-role and a long-role prefill + one decode with
the tiny model on loopback give the colocated server's outputs on every route, streamed and not,
and short prompts reach only the short instance (its ``sglang:num_requests_total``)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pd_utils import (
    ROUTER_ADMIN_HEADERS,
    async_client,
    read_sse_events,
    load,
    metric_value,
    routed_cluster,
    wait_free_pages,
)

pytestmark = pytest.mark.timeout(300)

THRESHOLD = 32
SAMPLING = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
SHORT_BODIES = [
    {"input_ids": [3 + (j * 31) % 500 for j in range(12)], "sampling_params": SAMPLING},
    {"text": "The lighthouse keeper", "sampling_params": SAMPLING},
]
LONG_BODIES = [
    {"input_ids": [3 + (j * 7919) % 6000 for j in range(300)], "sampling_params": SAMPLING},
    {"input_ids": [5 + (j * 104729) % 6000 for j in range(90)], "sampling_params": SAMPLING},
]
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def routed(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("pd-router-logs")
    role = ("--short-prefill-threshold", str(THRESHOLD), "--prefill-role")
    with routed_cluster(tiny_model_dir, log_dir, [(*role, "short"), (*role, "long")], 1,
                        ("--tokenizer-path", tiny_model_dir, "--pool-controller", "off")) as c:
        yield c


def test_outputs_equal_colocated_and_short_prompts_stay_in_the_short_pool(routed,
                                                                         colocated_server) -> None:
    router, (short_p, long_p), (decode,) = routed
    servers = [short_p.base_url, long_p.base_url, decode.base_url]
    total = {url: load(url)["num_total_pages"] for url in servers}
    workers = httpx.get(router.base_url + "/workers", timeout=10, headers=ROUTER_ADMIN_HEADERS).json()
    assert workers["short_prefill_threshold"] == THRESHOLD  # read from the servers
    assert workers["pools"] == {"short": 1, "long": 1, "both": 0}
    before = {u: metric_value(u, "sglang:num_requests_total") for u in servers[:2]}
    model = httpx.get(colocated_server.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    bodies = SHORT_BODIES + LONG_BODIES

    async def run():
        async with async_client() as client:
            ref, via = colocated_server.base_url, router.base_url
            want = await asyncio.gather(*(client.post(ref + "/generate", json=b) for b in bodies))
            got = await asyncio.gather(*(client.post(via + "/generate", json=b) for b in bodies))
            streamed = await asyncio.gather(*(read_sse_events(client, via + "/generate", {**b, "stream": True})
                                              for b in bodies))
            comp = {**COMPLETION, "model": model}
            chat = {**CHAT, "model": model}
            oa = await asyncio.gather(
                client.post(ref + "/v1/completions", json=comp),
                client.post(via + "/v1/completions", json=comp),
                read_sse_events(client, via + "/v1/completions", {**comp, "stream": True}),
                client.post(ref + "/v1/chat/completions", json=chat),
                client.post(via + "/v1/chat/completions", json=chat),
                read_sse_events(client, via + "/v1/chat/completions", {**chat, "stream": True}))
            return want, got, streamed, oa

    want, got, streamed, oa = asyncio.run(run())
    for i, (w, g, events) in enumerate(zip(want, got, streamed)):
        assert w.status_code == 200 and g.status_code == 200, (i, w.text, g.text)
        assert g.json()["output_ids"] == w.json()["output_ids"], i
        assert g.json().get("text") == w.json().get("text"), i
        assert events[-1]["output_ids"] == w.json()["output_ids"], i
    comp_ref, comp_got, comp_events, chat_ref, chat_got, chat_events = oa
    text = comp_ref.json()["choices"][0]["text"]
    assert comp_got.status_code == 200 and comp_got.json()["choices"][0]["text"] == text
    assert "".join(e["choices"][0]["text"] for e in comp_events if e.get("choices")) == text
    content = chat_ref.json()["choices"][0]["message"]["content"]
    assert chat_got.json()["choices"][0]["message"]["content"] == content
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in chat_events
                   if e.get("choices")) == content

    # 2 short bodies x 2 (plain, streamed) + the completion and chat x 2: all short prompts
    after = {u: metric_value(u, "sglang:num_requests_total") for u in servers[:2]}
    assert after[short_p.base_url] - before[short_p.base_url] == 2 * len(SHORT_BODIES) + 4
    assert after[long_p.base_url] - before[long_p.base_url] == 2 * len(LONG_BODIES)
    routed_metrics = httpx.get(router.base_url + "/metrics", timeout=10, headers=ROUTER_ADMIN_HEADERS).text
    assert 'request_class="short"' in routed_metrics and 'request_class="long"' in routed_metrics
    for url in servers:
        wait_free_pages(url, total[url])
