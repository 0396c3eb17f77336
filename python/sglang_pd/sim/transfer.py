"""KV transfer time from prefill to decode (DESIGN.md section 4).

Bytes per token come from the model shape (``ModelShape.kv_bytes_per_token``), not from the
engine's torch ``KVPool``. A link has a bandwidth and a fixed latency per transfer (CPU
figures: docs/disaggregation.md; GPU clusters: RDMA ~25-50 GB/s per pair, NVLink more).

Streaming (as the engine: every finished chunk is written while the next one computes): the
sending starts when the first chunk is done and decode has registered its pages, whichever is
later (a prefill schedules a PD request only after decode registered, core/pd_rules.py, so
that is the first chunk), and cannot end before the last chunk's bytes have crossed the link
after the prefill ends. Links are dedicated per prefill-decode pair (no contention): an assumption.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferModel:
    bytes_per_token: float
    link_bytes_s: float = 25e9
    latency_s: float = 1e-3

    def __post_init__(self) -> None:
        if not self.link_bytes_s > 0 or not self.latency_s >= 0 or not self.bytes_per_token > 0:
            raise ValueError(f"transfer model needs bandwidth > 0, latency >= 0 and bytes/token > 0, "
                             f"got {self.link_bytes_s}, {self.latency_s}, {self.bytes_per_token}")

    def done_at(self, tokens: int, last_chunk_tokens: int, first_chunk_done: float,
                prefill_done: float, decode_ready: float) -> float:
        """When the last byte of ``tokens`` tokens' KV has arrived at decode."""
        per_tok = self.bytes_per_token / self.link_bytes_s
        start = max(first_chunk_done, decode_ready)
        tail_from = max(prefill_done, decode_ready)
        return max(start + tokens * per_tok, tail_from + last_chunk_tokens * per_tok) + self.latency_s
