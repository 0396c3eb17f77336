"""The one rule for a request without an SLO (docs/scheduling.md, "SLOs"), for every policy.

A request's SLO reaches the policies resolved (``protocol.Slo``: its own, else the server's
``--slo-*-ms`` default, applied once where the request entered); policies never apply that
default again. What is still unset means "no SLO", and every policy reads it the same way:

- The request has a far target: ``prefill_no_slo_ttft_ms`` (30 s) for its TTFT,
  ``decode_no_slo_tpot_ms`` (1 s) for its TPOT. It ranks behind SLO'd work, yet ages like any
  other request instead of waiting behind every SLO'd one forever.
- When no request a policy decides over has an SLO at all, the policy may run its SLO-free mode
  (AWD: token-max batching; slack decoding: plain continuous batching).
"""

from __future__ import annotations

from sglang_pd.scheduling.config import PolicyConfig


def no_slo_ttft_s(cfg: PolicyConfig) -> float:
    """TTFT target of a request without a TTFT SLO."""
    return cfg.prefill_no_slo_ttft_ms / 1e3


def no_slo_tpot_s(cfg: PolicyConfig) -> float:
    """TPOT target of a request without a TPOT SLO."""
    return cfg.decode_no_slo_tpot_ms / 1e3
