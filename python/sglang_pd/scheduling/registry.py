"""Policies by name: adding one is one file plus one line here."""

from __future__ import annotations

from collections.abc import Callable

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.decode.slack import KairosSlackDecodePolicy
from sglang_pd.scheduling.decode.slack_plus import SlackPlusDecodePolicy
from sglang_pd.scheduling.prefill.dual import DualQueuePrefillPolicy
from sglang_pd.scheduling.prefill.edf import EdfPrefillPolicy
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy
from sglang_pd.scheduling.prefill.kairos import KairosPrefillPolicy
from sglang_pd.scheduling.prefill.kairos_plus import KairosPlusPrefillPolicy
from sglang_pd.scheduling.prefill.lars import LarsPrefillPolicy
from sglang_pd.scheduling.prefill.lrs import LrsPrefillPolicy
from sglang_pd.scheduling.prefill.sglang_spf import SglangSpfPrefillPolicy
from sglang_pd.scheduling.prefill.sjf import SjfPrefillPolicy
from sglang_pd.scheduling.prefill.vllm_threshold import VllmThresholdPrefillPolicy
from sglang_pd.scheduling.types import DecodePolicy, PrefillPolicy

PREFILL_POLICIES: dict[str, Callable[[PolicyConfig], PrefillPolicy]] = {
    "fcfs": FcfsPrefillPolicy,
    "kairos": KairosPrefillPolicy,  # Kairos §3.1 Alg. 1-2 as written
    "kairos+": KairosPlusPrefillPolicy,  # ours: fitted finish times, rescue rules
    "lars": LarsPrefillPolicy,  # Medha §4.1
    "edf": EdfPrefillPolicy,  # Medha §4.1's comparison
    "lrs": LrsPrefillPolicy,  # Medha §4.1's comparison
    "sjf": SjfPrefillPolicy,  # Kairos §3.1's comparison
    "sglang-spf": SglangSpfPrefillPolicy,  # baseline: SGLang's shortest-prefill-first (PR #40024)
    "vllm-threshold": VllmThresholdPrefillPolicy,  # baseline: vLLM's --long-prefill-token-threshold
}
DECODE_POLICIES: dict[str, Callable[[PolicyConfig], DecodePolicy]] = {
    "continuous": ContinuousDecodePolicy,
    "slack": KairosSlackDecodePolicy,  # Kairos §3.2 Alg. 3 as written
    "slack+": SlackPlusDecodePolicy,  # ours: every request kept on its TPOT pace
}


def create_prefill_policy(name: str, cfg: PolicyConfig | None = None) -> PrefillPolicy:
    """The named policy; with dual queues (``cfg.dual_queues``) it serves the long queue inside
    ``DualQueuePrefillPolicy`` (short queue by AWD, docs/prefill_scheduling.md)."""
    if name not in PREFILL_POLICIES:
        raise ValueError(f"unknown prefill policy {name!r}; supported: {sorted(PREFILL_POLICIES)}")
    cfg = cfg if cfg is not None else PolicyConfig()
    policy = PREFILL_POLICIES[name](cfg)
    return DualQueuePrefillPolicy(cfg, policy) if cfg.dual_queues else policy


def create_decode_policy(name: str, cfg: PolicyConfig | None = None) -> DecodePolicy:
    if name not in DECODE_POLICIES:
        raise ValueError(f"unknown decode policy {name!r}; supported: {sorted(DECODE_POLICIES)}")
    return DECODE_POLICIES[name](cfg if cfg is not None else PolicyConfig())


def register_prefill_policy(name: str, factory: Callable[[PolicyConfig], PrefillPolicy]) -> None:
    """Out-of-tree policies (plugin modules named in SGLANG_PD_POLICY_PLUGINS) register here."""
    PREFILL_POLICIES[name] = factory


def register_decode_policy(name: str, factory: Callable[[PolicyConfig], DecodePolicy]) -> None:
    DECODE_POLICIES[name] = factory
