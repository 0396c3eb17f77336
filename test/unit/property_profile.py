"""The one switch between a property test's CI run and its long run (docs/scheduling.md).

CI runs a fixed, derandomized set of examples; ``SGLANG_PD_PROPERTY_LONG=1`` runs more
(``SGLANG_PD_PROPERTY_EXAMPLES`` of them, else the file's own long default), with fresh seeds.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_CHECKS = [HealthCheck.too_slow, HealthCheck.filter_too_much]


def property_profile(ci_examples: int, long_examples: int) -> settings:
    """Hypothesis settings for this run: CI's (derandomized) or the long run's."""
    if os.environ.get("SGLANG_PD_PROPERTY_LONG") == "1":
        n = int(os.environ.get("SGLANG_PD_PROPERTY_EXAMPLES", str(long_examples)))
        return settings(max_examples=n, deadline=None, database=None, suppress_health_check=_CHECKS)
    return settings(max_examples=ci_examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=_CHECKS)
