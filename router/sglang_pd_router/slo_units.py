"""SLO units: the wire, the flags and the router's per-class defaults give SLOs in milliseconds
(SGLang's ``x-slo-*-ms`` names); policies read seconds. This is the one conversion, shared by the
router, the servers (``protocol.Slo.from_ms``, ``PolicyConfig.slo_*_s``) and the simulator.

Torch-free and dependency-free, in the router's package for the reason ``request_class.py`` gives.
"""

from __future__ import annotations

import math


def slo_ms_to_s(ms: object) -> float | None:
    """Seconds for an SLO given in milliseconds; None ("no SLO", docs/scheduling.md "SLOs") for
    0, a missing value, or anything that is not a positive finite number (a bool included)."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        return None
    if not math.isfinite(ms) or ms <= 0:
        return None
    return ms / 1e3
