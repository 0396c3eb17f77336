"""Policies by name: adding one is one file plus one line here."""

from __future__ import annotations

from typing import Callable

from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy
from sglang_pd.scheduling.types import DecodePolicy, PrefillPolicy

PREFILL_POLICIES: dict[str, Callable[[], PrefillPolicy]] = {"fcfs": FcfsPrefillPolicy}
DECODE_POLICIES: dict[str, Callable[[], DecodePolicy]] = {"continuous": ContinuousDecodePolicy}


def create_prefill_policy(name: str) -> PrefillPolicy:
    if name not in PREFILL_POLICIES:
        raise ValueError(f"unknown prefill policy {name!r}; supported: {sorted(PREFILL_POLICIES)}")
    return PREFILL_POLICIES[name]()


def create_decode_policy(name: str) -> DecodePolicy:
    if name not in DECODE_POLICIES:
        raise ValueError(f"unknown decode policy {name!r}; supported: {sorted(DECODE_POLICIES)}")
    return DECODE_POLICIES[name]()
