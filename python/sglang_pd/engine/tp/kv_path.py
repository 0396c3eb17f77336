"""Which data path moves KV between PD servers with TP (docs/disaggregation.md section 11).

``per_rank`` (default): every rank writes its own KV heads to the decode rank(s) that hold them
(rank_kv.py, rank_writer.py). ``staging``: the earlier design, kept as a fallback: rank 0 of
each side gathers/scatters every head through an all-heads staging copy (kv_move.py); it costs
rank 0 (1 + N)x its pool's memory. Read from ``SGLANG_PD_TP_KV``; the ranks inherit it.
"""

from __future__ import annotations

import os

TP_KV_ENV = "SGLANG_PD_TP_KV"
PATHS = ("per_rank", "staging")


def tp_kv_path() -> str:
    path = os.environ.get(TP_KV_ENV, "per_rank") or "per_rank"
    if path not in PATHS:
        raise ValueError(f"{TP_KV_ENV}={path!r}: expected one of {PATHS}")
    return path
