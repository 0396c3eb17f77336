"""PLA-Serve's lightweight instance-pressure controller (§3.2 "Spatial disaggregation", Alg. 2).

Pure: no I/O, no clock (``now`` is passed in); the router and the simulator both drive it. Every
control period the caller hands it one ``InstanceSignals`` per prefill instance; ``step`` answers
with at most one ``RoleMove`` (an instance to move from one pool to the other) or None.

Per instance, psi = alpha q + beta e + gamma u over normalised signals, pool pressure = the p90 of
its instances' psi (the paper's robust aggregator A), and after the cool-down one instance moves
long -> short when the short pool is under more pressure by the hysteresis (and the long pool
keeps its minimum), or the mirror case.

Deviations from the paper, named:
- Normalised signals. The paper gives no units. Here each is in [0, 1]:
  q = predicted queue time / the pool's TTFT reference (clipped at 1): a backlog as long as the
      class's TTFT SLO is full pressure, so token counts of long and short pools compare fairly;
  e = mean TTFT SLO deviation (ttft - slo) / slo, clipped to [0, 1]: only violations push (slack
      would make an idle pool look relieved and a server reporting 0 for "no samples" neutral);
  u = busy fraction of the period (0..1).
  psi is then rescaled to [0, 1] by the weights' range, so a pool's pressure is in [0, 1] too.
- The sign of utilisation. Alg. 2 writes psi = a q + b e - g u. Taken literally, an idle
  instance (u = 0) outranks a saturated one with the same backlog and instances drift toward the
  idle pool. Here gamma multiplies +u by default (busy is pressure); ``gamma < 0`` gives the
  paper's form exactly (``ControllerConfig.as_written()``).
- Hysteresis that survives zero. As written, P_s > (1 + tau) P_l flips meaning for negative P and
  fires on any noise when P_l = 0. With P in [0, 1] it cannot go negative, and a move needs both
  the relative margin and an absolute one: P_s > (1 + tau) P_l + delta ("relative-plus-absolute
  hysteresis"); delta keeps two nearly idle pools from trading instances.
- Which instance moves: the donor pool's least pressured healthy one (it drains fastest). A move
  is only proposed when no instance is still draining from the previous one (the router pushes
  work, so a moved instance first finishes what it holds, then switches role).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence

MANAGED_ROLES = ("short", "long")


@dataclass
class InstanceSignals:
    url: str
    role: str  # the pool it serves now: "short" | "long" ("both" instances are not managed)
    queued_prefill_tokens: int = 0
    prefill_tokens_per_s: float = 0.0  # learned throughput; 0 = unknown (the config's prior)
    slo_ttft_deviation: float = 0.0  # mean (ttft - slo) / slo over recent first tokens
    busy_fraction: float = 0.0  # share of the period the engine spent stepping, 0..1
    healthy: bool = True
    draining: bool = False  # moving to the other pool, finishing its work first


@dataclass
class RoleMove:
    url: str
    from_role: str
    to_role: str
    short_pressure: float  # the pool pressures that decided it (for logs and metrics)
    long_pressure: float


@dataclass
class ControllerConfig:
    period_s: float = 2.0  # Delta t
    cooldown_s: float = 10.0  # T_cool
    tau: float = 0.25  # relative hysteresis
    delta: float = 0.05  # absolute hysteresis (pressures are in [0, 1])
    min_per_pool: int = 1  # n_min
    alpha: float = 1.0  # queue backlog weight
    beta: float = 1.0  # SLO deviation weight
    gamma: float = 0.5  # utilisation weight (negative = the paper's sign)
    queue_ref_s_short: float = 0.5  # predicted queue time that counts as full pressure
    queue_ref_s_long: float = 5.0
    default_prefill_tokens_per_s: float = 10000.0
    percentile: float = 90.0  # the robust aggregator A

    def __post_init__(self) -> None:
        for name in ("period_s", "queue_ref_s_short", "queue_ref_s_long",
                     "default_prefill_tokens_per_s"):
            if not getattr(self, name) > 0:  # also refuses NaN
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("cooldown_s", "tau", "delta", "alpha", "beta"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not math.isfinite(self.gamma):
            raise ValueError(f"gamma must be finite, got {self.gamma}")
        if self.alpha + self.beta + abs(self.gamma) <= 0:
            raise ValueError("at least one of alpha, beta, gamma must be non-zero")
        if isinstance(self.min_per_pool, bool) or not isinstance(self.min_per_pool, int) \
                or self.min_per_pool < 0:
            raise ValueError(f"min_per_pool must be an int >= 0, got {self.min_per_pool!r}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")

    @classmethod
    def as_written(cls, **overrides: float) -> ControllerConfig:
        """Alg. 2's sign for utilisation (psi = a q + b e - g u)."""
        overrides.setdefault("gamma", -0.5)
        return cls(**overrides)  # type: ignore[arg-type]


def _clip01(x: float) -> float:
    if math.isnan(x):
        return 0.0
    return min(max(x, 0.0), 1.0)


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (numpy's default method), without numpy."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * pct / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def instance_pressure(sig: InstanceSignals, cfg: ControllerConfig) -> float:
    """psi of one instance, rescaled to [0, 1] (see the module docstring)."""
    rate = sig.prefill_tokens_per_s if sig.prefill_tokens_per_s > 0 \
        else cfg.default_prefill_tokens_per_s
    ref_s = cfg.queue_ref_s_short if sig.role == "short" else cfg.queue_ref_s_long
    q = _clip01(max(sig.queued_prefill_tokens, 0) / rate / ref_s)
    e = _clip01(sig.slo_ttft_deviation)
    u = _clip01(sig.busy_fraction)
    raw = cfg.alpha * q + cfg.beta * e + cfg.gamma * u
    lowest = min(cfg.gamma, 0.0)
    highest = cfg.alpha + cfg.beta + max(cfg.gamma, 0.0)
    return (raw - lowest) / (highest - lowest)


class PoolController:
    """Alg. 2, one decision per ``step``; holds only the time of the last move."""

    def __init__(self, cfg: ControllerConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else ControllerConfig()
        self.last_move_time = -math.inf  # t_last
        self.last_pressures: dict[str, float] = {"short": 0.0, "long": 0.0}

    def pool_pressures(self, signals: Sequence[InstanceSignals]) -> dict[str, float]:
        """role -> P (0 for an empty pool) over healthy, non-draining instances."""
        out: dict[str, float] = {}
        for role in MANAGED_ROLES:
            psis = [instance_pressure(s, self.cfg) for s in signals
                    if s.role == role and s.healthy and not s.draining]
            out[role] = percentile(psis, self.cfg.percentile) if psis else 0.0
        return out

    def step(self, now: float, signals: Sequence[InstanceSignals]) -> RoleMove | None:
        for s in signals:
            if s.role not in MANAGED_ROLES + ("both",):
                raise ValueError(f"instance {s.url}: role must be short|long|both, got {s.role!r}")
        pressures = self.pool_pressures(signals)
        self.last_pressures = pressures
        if now - self.last_move_time < self.cfg.cooldown_s:
            return None
        if any(s.draining for s in signals):
            return None  # the previous move has not finished
        p_s, p_l = pressures["short"], pressures["long"]
        cfg = self.cfg
        if p_s > (1 + cfg.tau) * p_l + cfg.delta:
            donor, taker = "long", "short"
        elif p_l > (1 + cfg.tau) * p_s + cfg.delta:
            donor, taker = "short", "long"
        else:
            return None
        members = [s for s in signals if s.role == donor and s.healthy]
        if len(members) <= cfg.min_per_pool or not members:
            return None
        chosen = min(members, key=lambda s: (instance_pressure(s, cfg), s.url))
        self.last_move_time = now
        return RoleMove(chosen.url, donor, taker, p_s, p_l)
