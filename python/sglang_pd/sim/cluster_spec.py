"""What a simulated cluster is made of (``ClusterSpec``) and what a run returns (``SimResult``);
the cluster itself is ``sim/cluster.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pd_router.controller import ControllerConfig, RoleMove
from sglang_pd_router.policies import RoutingConfig

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.sim.instance import Instance, Track


@dataclass
class ClusterSpec:
    num_prefill: int = 1
    num_decode: int = 1
    num_colocated: int = 0  # > 0: a colocated cluster (num_prefill / num_decode ignored)
    prefill_roles: list[str] | None = None  # per prefill instance: both | short | long
    prefill_policy: str = "fcfs"
    decode_policy: str = "continuous"
    router_prefill: str = "round_robin"
    router_decode: str = "round_robin"
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    cfg: PolicyConfig = field(default_factory=PolicyConfig)
    exact: bool = False  # schedulers get the true prefill cost model
    prefix_cache_tokens: int = 0  # per prefill instance; 0 = off
    # decode-side reuse (the engine's --disaggregation-decode-enable-radix-cache): per decode
    # instance, a cache of finished requests' blocks; a follow-up's held leading blocks are not
    # transferred again. 0 = off, as the engine's default
    decode_prefix_cache_tokens: int = 0
    num_reserved_decode_tokens: int = 512
    link_gb_s: float = 25.0
    link_latency_ms: float = 1.0
    # the transfer layer's timeouts (DisaggEnvs, 300 s): decode not pre-allocated this long
    # after arrival (prefill's bootstrap timeout), or decode ready and the prefill not done
    # this long after (decode's waiting timeout): the request fails
    pd_timeout_s: float = 300.0
    # TTFT SLO of long-class requests (new prompt tokens over routing.short_prefill_threshold)
    # carrying none; short ones get cfg.slo_ttft_ms (the router's per-class --slo-ttft-ms SHORT LONG)
    slo_ttft_s_long: float | None = None
    pool_controller: ControllerConfig | None = None  # PLA's Alg. 2 over short/long prefill roles
    seed: int = 0
    # GPUs per instance (TP size) of each side, for the GPU count; the step costs at those sizes
    # are the Cluster's ``cost`` / ``decode_cost``. Colocated instances are prefill_tp wide.
    prefill_tp: int = 1
    decode_tp: int = 1

    @property
    def num_gpus_instances(self) -> int:
        return self.num_colocated or self.num_prefill + self.num_decode

    @property
    def num_gpus(self) -> int:
        if self.num_colocated:
            return self.num_colocated * self.prefill_tp
        return self.num_prefill * self.prefill_tp + self.num_decode * self.decode_tp

    def describe(self) -> str:
        shape = f"{self.num_colocated} colocated" if self.num_colocated else f"{self.num_prefill}P+{self.num_decode}D"
        if not self.num_colocated and self.prefill_tp != self.decode_tp:
            shape += f" (TP{self.prefill_tp}/TP{self.decode_tp})"
        return f"{shape} {self.prefill_policy}+{self.decode_policy}{' exact' if self.exact else ''}"


@dataclass
class SimResult:
    tracks: list[Track]
    instances: list[Instance]
    samples: list[tuple[float, list[tuple[int, int, int, float]]]]  # t, per instance (wait, run, park, usage)
    sim_end_s: float
    wall_s: float
    num_events: int
    moves: list[tuple[float, RoleMove]] = field(default_factory=list)  # the pool controller's
