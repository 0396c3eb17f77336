"""``python -m sglang_pd.sim {run,sweep,plan}``: flags shared by the three commands.

Policy and scheduling flags carry the server's names (``--prefill-policy``, ``--prefill-queues``,
``--decode-policy``, ``--slo-ttft-ms``, ...) and go into the one ``PolicyConfig``; every
PolicyConfig flag is generated from its field (utils/flags.py), as the server's are.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from sglang_pd_router.controller import ControllerConfig
from sglang_pd_router.policies import ROUTING_POLICIES, RoutingConfig
from sglang_pd_router.request_class import SHORT_PREFILL_THRESHOLD

from sglang_pd.bench.metrics import SloSpec
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.profile import load_profile
from sglang_pd.scheduling.registry import DECODE_POLICIES, PREFILL_POLICIES
from sglang_pd.sim.cluster_spec import ClusterSpec
from sglang_pd.sim.profiles import StepCost, at_tp, build_cost, pads, profile_tp
from sglang_pd.sim.workload import Workload, from_trace, parse_mix, synthetic
from sglang_pd.utils.flags import add_flags, from_flags


def add_common(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("workload")
    w.add_argument("--trace", help="trace short name (azure-conv, azure-code, mooncake, sharegpt-lengths) or file")
    w.add_argument("--limit", type=int, help="first N requests of the trace (after --window)")
    w.add_argument("--window", type=int, help="requests per trace window (Kairos: 1000)")
    w.add_argument("--window-index", type=int, default=0)
    w.add_argument("--mix", help="synthetic lengths NAME:WEIGHT,... (trace names, medha-swe, pla-chat, fixed:IN:OUT)")
    w.add_argument("--num-requests", type=int, default=1000, help="synthetic requests")
    w.add_argument("--qps", type=float, help="arrival rate; rescales a timed trace to this mean rate")
    w.add_argument("--burstiness", type=float, default=1.0, help="Gamma shape of the gaps (1 = Poisson)")
    w.add_argument("--concurrency", type=int, help="closed loop: requests kept in flight (synthetic)")
    w.add_argument("--seed", type=int, default=1)
    c = p.add_argument_group("cluster")
    c.add_argument("--prefill", type=int, default=1, help="prefill instances")
    c.add_argument("--decode", type=int, default=1, help="decode instances")
    c.add_argument("--colocated", type=int, default=0, help="colocated instances instead of PD")
    c.add_argument("--prefill-role", default=None, help="per prefill instance, comma-separated: both|short|long")
    c.add_argument("--router-prefill", default="round_robin", choices=sorted(ROUTING_POLICIES))
    c.add_argument("--router-decode", default="round_robin", choices=sorted(ROUTING_POLICIES))
    c.add_argument("--profile", default="llama-3-8b@h100",
                   help="cost profile: MODEL@HW[xTP] (analytic), minimax-m2.5@h200x4 (Kairos-calibrated), or a profile .json")
    c.add_argument("--tp", type=int, default=1, help="GPUs per instance when --profile names none")
    c.add_argument("--decode-tp", type=int, default=None,
                   help="TP size of the decode instances (default: prefill's); their step costs come from "
                        "the analytic model at that size (needs a MODEL@HW[xTP] profile)")
    c.add_argument("--kv-capacity-tokens", type=int, help="KV pool per instance (default: from the memory model)")
    c.add_argument("--kv-bytes-per-token", type=float, help="KV bytes per token (default: from the model shape)")
    c.add_argument("--noise", type=float, default=0.0, help="relative std of step times (ground truth)")
    c.add_argument("--exact", action="store_true", help="schedulers get the true prefill cost model")
    c.add_argument("--link-gb-s", type=float, default=25.0, help="prefill->decode link GB/s")
    c.add_argument("--link-latency-ms", type=float, default=1.0)
    c.add_argument("--pd-timeout-s", type=float, default=300.0,
                   help="PD: a request whose decode has not pre-allocated its pages this long after arrival "
                        "(the prefill server's bootstrap timeout), or one side ready and the other not "
                        "this long, fails (DisaggEnvs)")
    c.add_argument("--prefix-cache-tokens", type=int, default=0,
                   help="prefix cache per prefill instance over hash_ids (512-token blocks); 0 = off")
    c.add_argument("--decode-prefix-cache-tokens", type=int, default=0,
                   help="decode-side reuse: a cache of finished requests' hash_ids per decode instance; "
                        "a follow-up's held blocks are not transferred; 0 = off")
    _c = ControllerConfig()
    c.add_argument("--pool-controller", choices=("on", "off"), default="off",
                   help="the router's PoolController (PLA Alg. 2) moves prefill instances between the "
                        "short and long roles (needs --prefill-queues dual and --prefill-role short,...,long)")
    c.add_argument("--controller-period-s", type=float, default=_c.period_s)
    c.add_argument("--controller-cooldown-s", type=float, default=_c.cooldown_s)
    c.add_argument("--controller-tau", type=float, default=_c.tau, help="relative hysteresis")
    c.add_argument("--controller-delta", type=float, default=_c.delta, help="absolute hysteresis")
    c.add_argument("--controller-min-per-pool", type=int, default=_c.min_per_pool)
    c.add_argument("--controller-queue-ref-s", type=float, nargs=2, metavar=("SHORT", "LONG"),
                   help="predicted queue time counted as full pressure per pool (default: the TTFT SLOs "
                        "of the classes when given, else the router's defaults)")
    s = p.add_argument_group("scheduling (server flag names)")
    s.add_argument("--prefill-policy", default="fcfs", choices=sorted(PREFILL_POLICIES))
    s.add_argument("--decode-policy", default="continuous", choices=sorted(DECODE_POLICIES))
    s.add_argument("--num-reserved-decode-tokens", type=int, default=512)
    # every PolicyConfig setting, from its field (--prefill-role is per instance, above)
    add_flags(s, PolicyConfig, exclude=("prefill_role",))
    s.add_argument("--slo-ttft-ms-long", type=float,
                   help="TTFT SLO of long requests (new prompt tokens over --short-prefill-threshold); "
                        "--slo-ttft-ms is then the short class's (the router's --slo-ttft-ms SHORT LONG)")
    o = p.add_argument_group("output")
    o.add_argument("--output-dir", help="requests.jsonl, summary.json and PNG plots go here")
    o.add_argument("--long-threshold", type=int, default=8192, help="prompt tokens from which a request is long")
    o.add_argument("--no-progress", action="store_true")


def policy_config(a: argparse.Namespace) -> PolicyConfig:
    padded = False
    if str(a.profile).endswith(".json") and Path(a.profile).is_file():  # (a missing one: build_cost says)
        padded = pads(load_profile(a.profile))  # the engine pads as profiled
    return cast(PolicyConfig, from_flags(PolicyConfig, a, prefill_role="both", decode_attention_padded=padded))


def cluster_spec(a: argparse.Namespace, prefill_policy: str | None = None, decode_policy: str | None = None,
                 exact: bool | None = None, num_prefill: int | None = None, num_decode: int | None = None,
                 num_colocated: int | None = None) -> ClusterSpec:
    cfg = policy_config(a)
    routing = RoutingConfig(short_prefill_threshold=cfg.short_prefill_threshold or SHORT_PREFILL_THRESHOLD)
    roles = [r.strip() for r in a.prefill_role.split(",")] if a.prefill_role else None
    n_p = a.prefill if num_prefill is None else num_prefill
    if roles is not None and len(roles) == 1:
        roles = roles * n_p
    controller = None
    if a.pool_controller == "on":
        refs = a.controller_queue_ref_s
        if refs is None and a.slo_ttft_ms and a.slo_ttft_ms_long:
            refs = (a.slo_ttft_ms / 1e3, a.slo_ttft_ms_long / 1e3)
        base = ControllerConfig()
        controller = ControllerConfig(period_s=a.controller_period_s, cooldown_s=a.controller_cooldown_s,
                                      tau=a.controller_tau, delta=a.controller_delta,
                                      min_per_pool=a.controller_min_per_pool,
                                      queue_ref_s_short=refs[0] if refs else base.queue_ref_s_short,
                                      queue_ref_s_long=refs[1] if refs else base.queue_ref_s_long)
    n_c = a.colocated if num_colocated is None else num_colocated
    if a.decode_tp is not None:
        at_tp(a.profile, a.decode_tp)  # a profile that fixes its TP says so before anything is read
    if n_c and mixed_tp(a):
        raise ValueError("--decode-tp is for PD clusters; colocated instances have one TP size (--tp)")
    if a.slo_ttft_ms_long is not None and not a.slo_ttft_ms_long > 0:
        raise ValueError(f"--slo-ttft-ms-long must be > 0, got {a.slo_ttft_ms_long}")
    return ClusterSpec(num_prefill=n_p, num_decode=a.decode if num_decode is None else num_decode,
                       num_colocated=n_c, prefill_roles=roles,
                       prefill_policy=prefill_policy or a.prefill_policy, decode_policy=decode_policy or a.decode_policy,
                       router_prefill=a.router_prefill, router_decode=a.router_decode, routing=routing, cfg=cfg,
                       exact=a.exact if exact is None else exact, prefix_cache_tokens=a.prefix_cache_tokens,
                       decode_prefix_cache_tokens=a.decode_prefix_cache_tokens,
                       num_reserved_decode_tokens=a.num_reserved_decode_tokens, link_gb_s=a.link_gb_s,
                       link_latency_ms=a.link_latency_ms, pd_timeout_s=a.pd_timeout_s,
                       slo_ttft_s_long=a.slo_ttft_ms_long / 1e3 if a.slo_ttft_ms_long else None,
                       pool_controller=controller, seed=a.seed, prefill_tp=profile_tp(a.profile, a.tp),
                       decode_tp=decode_tp_of(a))


def cost_of(a: argparse.Namespace) -> StepCost:
    return build_cost(a.profile, a.tp, a.kv_capacity_tokens, a.kv_bytes_per_token, a.noise, a.seed)


def decode_tp_of(a: argparse.Namespace) -> int:
    return profile_tp(a.profile, a.tp) if a.decode_tp is None else a.decode_tp


def mixed_tp(a: argparse.Namespace) -> bool:
    """Decode instances at another TP size than prefill's."""
    return decode_tp_of(a) != profile_tp(a.profile, a.tp)


def decode_cost_of(a: argparse.Namespace) -> StepCost | None:
    """Decode instances' own step costs under ``--decode-tp``; None: they share prefill's."""
    if a.decode_tp is None:
        return None
    # its own noise stream (seed + 1): the two sides' step times are independent
    return build_cost(at_tp(a.profile, a.decode_tp), a.decode_tp, a.kv_capacity_tokens, a.kv_bytes_per_token,
                      a.noise, a.seed + 1)


def workload_of(a: argparse.Namespace, qps: float | None = None) -> Workload:
    qps = a.qps if qps is None else qps
    if a.trace and a.mix:
        raise ValueError("give --trace or --mix, not both")
    if a.trace:
        return from_trace(a.trace, a.limit, a.window, a.window_index, qps, a.seed)
    if not a.mix:
        raise ValueError("give a workload: --trace NAME or --mix NAME:WEIGHT,... with --qps or --concurrency")
    return synthetic(parse_mix(a.mix), a.num_requests, qps if a.concurrency is None else None, a.burstiness,
                     a.concurrency, a.seed)


def slo_of(a: argparse.Namespace) -> SloSpec:
    return SloSpec(a.slo_ttft_ms, a.slo_tpot_ms)


@dataclass(frozen=True)
class PolicyPair:
    prefill: str
    decode: str
    exact: bool = False

    @classmethod
    def parse(cls, text: str) -> PolicyPair:
        """``PREFILL/DECODE[@exact]``, e.g. ``kairos+/slack+@exact``."""
        body, _, flag = text.strip().partition("@")
        pre, sep, dec = body.partition("/")
        if not sep or flag not in ("", "exact"):
            raise ValueError(f"policy pair {text!r}: expected PREFILL/DECODE[@exact], e.g. fcfs/continuous")
        for name, reg in ((pre, PREFILL_POLICIES), (dec, DECODE_POLICIES)):
            if name not in reg:
                raise ValueError(f"policy pair {text!r}: unknown policy {name!r}; known: {sorted(reg)}")
        return cls(pre, dec, flag == "exact")

    def __str__(self) -> str:
        return f"{self.prefill}/{self.decode}{'@exact' if self.exact else ''}"
