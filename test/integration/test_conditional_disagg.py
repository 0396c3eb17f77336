"""Conditional disaggregation end to end (issue 34 item 3): a decode server prefills a short
prompt itself when our router sends it with the local bootstrap host and no prefill leg. Two
routers over the same servers, one with ``--conditional-disagg on`` (by length alone, so every
short prompt is local) and one without: outputs are equal, streamed and not, on /generate and
/v1/completions; the prefill server sees none of the local requests; the router counts them
(``prefill="local"``); and the decode server's pages all come back (conserved)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pd_utils import (
    ROUTER_ADMIN_HEADERS,
    async_client,
    load,
    metric_value,
    read_sse_events,
    routed_cluster,
    start_pd_router,
    wait_free_pages,
)

pytestmark = pytest.mark.timeout(300)

THRESHOLD = 32
SAMPLING = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
SHORT_BODIES = [
    {"input_ids": [3 + (j * 31) % 500 for j in range(12)], "sampling_params": SAMPLING},
    {"input_ids": [7 + (j * 17) % 700 for j in range(30)], "sampling_params": SAMPLING},
    {"text": "The lighthouse keeper", "sampling_params": SAMPLING},
]
LONG_BODY = {"input_ids": [3 + (j * 7919) % 6000 for j in range(90)], "sampling_params": SAMPLING}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}


def test_short_prompts_prefilled_on_decode_equal_the_pd_path(tiny_model_dir, tmp_path) -> None:
    flags = ("--tokenizer-path", tiny_model_dir, "--pool-controller", "off",
             "--short-prefill-threshold", str(THRESHOLD))
    with routed_cluster(tiny_model_dir, tmp_path, [("--short-prefill-threshold", str(THRESHOLD))],
                        1, flags) as (pd_router, (prefill,), (decode,)):
        local_router = start_pd_router([prefill], [decode], tmp_path, *flags,
                                       "--conditional-disagg", "on",
                                       "--conditional-disagg-min-queue-tokens", "0")
        try:
            total = {u: load(u)["num_total_pages"] for u in (prefill.base_url, decode.base_url)}
            model = httpx.get(decode.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
            comp = {**COMPLETION, "model": model}

            async def through(url: str) -> tuple[list, list, list]:
                async with async_client() as client:
                    plain = [await client.post(url + "/generate", json=b) for b in SHORT_BODIES]
                    streamed = [await read_sse_events(client, url + "/generate", {**b, "stream": True})
                                for b in SHORT_BODIES]
                    oa = [await client.post(url + "/v1/completions", json=comp),
                          await read_sse_events(client, url + "/v1/completions", {**comp, "stream": True})]
                    return plain, streamed, oa

            want = asyncio.run(through(pd_router.base_url))
            p_before = metric_value(prefill.base_url, "sglang:num_requests_total")
            got = asyncio.run(through(local_router.base_url))
            assert metric_value(prefill.base_url, "sglang:num_requests_total") == p_before, \
                "a short prompt prefilled on decode must not reach the prefill server"

            for i, (w, g) in enumerate(zip(want[0], got[0])):
                assert w.status_code == 200 and g.status_code == 200, (i, w.text, g.text)
                assert g.json()["output_ids"] == w.json()["output_ids"], i
                assert g.json().get("text") == w.json().get("text"), i
            for i, (w, g) in enumerate(zip(want[1], got[1])):
                assert g[-1]["output_ids"] == w[-1]["output_ids"], i
            text = want[2][0].json()["choices"][0]["text"]
            assert got[2][0].json()["choices"][0]["text"] == text
            assert "".join(e["choices"][0]["text"] for e in got[2][1] if e.get("choices")) == text

            # a long prompt keeps its prefill leg on the conditional router
            r = httpx.post(local_router.base_url + "/generate", json=LONG_BODY, timeout=120)
            assert r.status_code == 200, r.text
            assert metric_value(prefill.base_url, "sglang:num_requests_total") == p_before + 1

            routed = httpx.get(local_router.base_url + "/metrics", timeout=10,
                               headers=ROUTER_ADMIN_HEADERS).text
            local = sum(float(line.rsplit(" ", 1)[1]) for line in routed.splitlines()
                        if line.startswith("sglang_pd_router_routed_requests_total{")
                        and 'prefill="local"' in line)
            assert local == 2 * len(SHORT_BODIES) + 2
            for url, pages in total.items():
                wait_free_pages(url, pages)  # conserved on both servers
        finally:
            local_router.stop()
