"""Issue 35 item 5: never HTTP 200 with wrong tokens. A real prefill + decode pair (tiny model,
NIXL over UCX) runs with faults injected at the transport seam (SGLANG_PD_TEST_KV_FAULTS,
transfer/faults.py): prefill posts every 4th WRITE late (past both sides' waiting timeout), decode
gets every notification twice, in reverse order, and loses every 6th. Every answer must be an
error status or exactly the colocated server's tokens, on both sides, and every page must come
back afterwards."""

from __future__ import annotations

import asyncio

import pytest
from pd_utils import (
    FAST_FAULT_ENV,
    async_client,
    load,
    nixl_missing,
    pd_request,
    start_decode,
    start_prefill,
    stop_all,
    wait_free_pages,
)

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(nixl_missing() is not None, reason=f"PD needs NIXL: {nixl_missing()}")]

SAMPLING = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
# chunked prefill is 64 tokens (PD_FLAGS): 1 to 5 chunks, so 1 to 5 WRITEs per request
LENGTHS = [9, 40, 65, 100, 130, 150, 200, 257, 300, 17, 70, 190]
BODIES = [{"input_ids": [3 + (i * 7919 + j * 104729) % 6000 for j in range(n)],
           "sampling_params": SAMPLING} for i, n in enumerate(LENGTHS)]
PREFILL_FAULTS = "delay_write_every=4,delay_write_s=7"
DECODE_FAULTS = "duplicate_notifs,reverse_notifs,drop_notif_every=6"


def test_faulty_transport_never_yields_200_with_wrong_tokens(tiny_model_dir, colocated_server,
                                                             tmp_path_factory) -> None:
    async def colocated():
        async with async_client() as client:
            url = colocated_server.base_url + "/generate"
            return [r.json() for r in await asyncio.gather(*(client.post(url, json=b)
                                                              for b in BODIES))]

    reference = asyncio.run(colocated())
    logs = tmp_path_factory.mktemp("pd-integrity-logs")
    prefill = start_prefill(tiny_model_dir, logs, env={**FAST_FAULT_ENV,
                                                       "SGLANG_PD_TEST_KV_FAULTS": PREFILL_FAULTS})
    decode = start_decode(tiny_model_dir, logs, env={**FAST_FAULT_ENV,
                                                     "SGLANG_PD_TEST_KV_FAULTS": DECODE_FAULTS})
    try:
        totals = {u: load(u)["num_total_pages"] for u in (prefill.base_url, decode.base_url)}

        async def pd():
            async with async_client() as client:
                return await asyncio.gather(*(pd_request(client, prefill, decode.base_url, b)
                                              for b in BODIES))

        results = asyncio.run(pd())
        ok = errors = 0
        table = []
        for i, (res, ref) in enumerate(zip(results, reference)):
            table.append((LENGTHS[i], res.prefill_status, res.decode_status))
            if res.decode_status == 200:
                ok += 1
                assert res.decode_body["output_ids"] == ref["output_ids"], f"prompt {i}: wrong tokens"
            else:
                errors += 1
                assert res.decode_status in (502, 503), (i, res.decode_status, res.decode_body)
                assert "KV transfer failed" in str(res.decode_body), res.decode_body
            if res.prefill_status == 200:  # prefill's own answer: the first token, exactly
                assert res.prefill_body["output_ids"] == ref["output_ids"][:1], i
            else:
                assert res.prefill_status in (502, 503), (i, res.prefill_status, res.prefill_body)
        print("prompt_len, prefill_status, decode_status:", table)
        assert ok and errors, f"faults must both fire and let some requests through: {table}"
        for url, total in totals.items():
            wait_free_pages(url, total, timeout=60)  # conservation: quarantines all ended
    finally:
        stop_all([prefill], [decode])
