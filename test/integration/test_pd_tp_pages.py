"""A PD server with TP gets as many KV pages as the same server without PD (issue 31, the
per-rank design): no rank keeps a staging copy (the earlier design's rank 0 held 1 + N times
its pool, so it got 1 / (1 + N) of the pages). Built in-process as rank 0 of a TP-2 server
(the shard arithmetic needs no peers to load), with the device memory fixed so the pool is
sized by --mem-fraction-static."""

from __future__ import annotations

import pytest
from pd_utils import nixl_missing
from sglang_pd.engine import memory
from sglang_pd.engine.build import build_engine
from sglang_pd.models.parallel import TPGroup
from sglang_pd.server_args import ServerArgs
from server_utils import free_port

pytestmark = pytest.mark.skipif(nixl_missing() is not None, reason=f"PD needs NIXL: {nixl_missing()}")

MEMORY = 64 << 20


def _pages(model: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: MEMORY)
    args = ServerArgs(model_path=model, tp_size=2, disaggregation_mode=mode, page_size=4,
                      mem_fraction_static=0.5, disaggregation_bootstrap_port=free_port())
    parts = build_engine(args, TPGroup(0, 2, None))
    try:
        return parts.kv_pool.num_pages
    finally:
        parts.pd.close()


def test_pd_tp_server_gets_the_colocated_page_count(tiny_model_dir: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    colocated = _pages(tiny_model_dir, "colocated", monkeypatch)
    prefill = _pages(tiny_model_dir, "prefill", monkeypatch)
    decode = _pages(tiny_model_dir, "decode", monkeypatch)
    # tiny llama: 4 layers, 2 KV heads (1 per rank), head_dim 32, fp32: 1 KiB per token per rank
    assert colocated == (MEMORY // 2 // 1024) // 4 + 1
    assert prefill == colocated and decode == colocated, (colocated, prefill, decode)
    print(f"\nKV pages, tp 2, {MEMORY >> 20} MiB x 0.5: colocated {colocated}, PD prefill "
          f"{prefill}, PD decode {decode}")
